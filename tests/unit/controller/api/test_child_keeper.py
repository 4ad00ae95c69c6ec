"""Keeping a child in shape (``api/children.py``): created when missing, never touched when not
ours, patched only when it drifted, a lost create race read back."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from packrat.controller.api.children import Outcome, keep, service_drift


class Kube:
    """Just enough of an API server: objects by (resource, name), every write recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.race: dict[str, Any] | None = None  # created by another between get and create

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((resource, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, resource: str, namespace: str, body: Mapping[str, Any]) -> bool:
        self.writes.append(("create", body["metadata"]["name"]))
        if self.race is not None:
            self.objects[(resource, body["metadata"]["name"])] = self.race
            return False
        self.objects[(resource, body["metadata"]["name"])] = copy.deepcopy(dict(body))
        return True

    def patch(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.writes.append(("patch", name))
        obj = self.objects[(resource, name)]
        for key, value in patch.items():
            obj[key] = {**obj.get(key, {}), **value}
        return copy.deepcopy(obj)


def _svc(selector: dict[str, str], *, owner: str = "m") -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "labels": {"app": "x"}, "ownerReferences": [{"name": owner}]},
        "spec": {"selector": selector, "ports": [{"port": 8080}]},
    }


def _ours(obj: Mapping[str, Any]) -> bool:
    return obj["metadata"]["ownerReferences"][0]["name"] == "m"


def test_missing_then_in_shape_then_drifted() -> None:
    kube, want = Kube(), _svc({"slot": "a"})
    kept = keep(kube, "services", "ns", want, ours=_ours, drift=service_drift)
    assert (kept.outcome, kept.created, kept.obj) == (Outcome.CREATED, True, want)
    again = keep(kube, "services", "ns", want, ours=_ours, drift=service_drift)
    assert again.outcome is Outcome.KEPT and kube.writes == [("create", "m")]
    kube.objects[("services", "m")]["spec"]["selector"] = {"slot": "b", "extra": "1"}
    fixed = keep(kube, "services", "ns", want, ours=_ours, drift=service_drift)
    assert fixed.outcome is Outcome.PATCHED and kube.writes[-1] == ("patch", "m")


def test_a_foreign_object_is_never_touched() -> None:
    kube = Kube()
    kube.objects[("services", "m")] = _svc({"slot": "z"}, owner="someone")
    kept = keep(kube, "services", "ns", _svc({"slot": "a"}), ours=_ours, drift=service_drift)
    assert (kept.outcome, kept.obj, kept.ours) == (Outcome.NOT_OURS, None, False)
    assert kube.writes == []


def test_a_lost_create_race_reads_back_whose_it_is() -> None:
    kube = Kube()
    kube.race = _svc({"slot": "z"}, owner="someone")
    kept = keep(kube, "services", "ns", _svc({"slot": "a"}), ours=_ours, drift=service_drift)
    assert kept.outcome is Outcome.NOT_OURS and kube.writes == [("create", "m")]


def test_settle_ends_before_the_patch() -> None:
    kube, want = Kube(), _svc({"slot": "a"})
    kube.objects[("services", "m")] = _svc({"slot": "b"})
    kept = keep(kube, "services", "ns", want, ours=_ours, drift=service_drift, settle=dict)
    assert kept.outcome is Outcome.KEPT and kube.writes == []


def test_service_drift_removes_extra_selector_keys_and_restores_labels() -> None:
    want = _svc({"slot": "a"})
    current = _svc({"slot": "a", "extra": "1"})
    current["metadata"]["labels"] = {}
    assert service_drift(current, want) == {
        "spec": {"selector": {"extra": None}},
        "metadata": {"labels": {"app": "x"}},
    }
    assert service_drift(want, want) == {}
