"""``spec.canary`` in the reconcile pass, against the in-memory API with a fake pod client:
the canary's objects, the split told to every ready stable pod only once the canary is ready,
the counts read back (untrusted: junk and other canaries' counts add nothing), the automatic
rollback, and the order of a stop (percent 0 on every stable pod first; nothing deleted while
one has not answered). The pods and the split are exercised for real in
tests/integration/test_operator_canary.py."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kube_support import NS, T0, FakeKube, ready_model, serving_pod, set_spec

from packrat.controller.core.fanout import Answer
from packrat.controller.core.options.canary import canary_settings
from packrat.controller.core.spec import validate_spec
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.switch.canary import CanaryClient, aggregate, crossed

V2 = {"zoo": "tiny", "name": "tiny"}
URL = "http://tiny-canary.ns.svc:8080/predictions/tiny"


class FakeCanaryPods(CanaryClient):
    """Records every configure, answers 200 unless the pod's URL is in ``refuse`` (503), and
    reports ``report`` as every pod's canary counts."""

    def __init__(self) -> None:
        super().__init__("http://{pod}:8080", "http://{service}.{namespace}.svc:8080")
        self.told: list[tuple[list[str], str | None, int]] = []
        self.refuse: set[str] = set()
        self.report: dict[str, Any] = {}

    def configure(
        self,
        urls: Sequence[str],
        *,
        target: str | None,
        percent: int,
        ident: str,
        token: str,
        owner: str = "",
    ) -> list[Answer]:
        assert len(token) >= 16 and owner == f"{NS}/tiny"
        self.told.append((list(urls), target, percent))
        return [Answer(503 if u in self.refuse else 200, b"{}") for u in urls]

    def stats(self, urls: Sequence[str], *, owner: str = "", token: str = "") -> list[Answer]:
        assert len(token) >= 16  # the live counts are the token's
        return [_json({"canary": self.report}) for _ in urls]


def _json(doc: Any, status: int = 200) -> Answer:
    return Answer(status, json.dumps(doc).encode())


def _setup() -> tuple[FakeKube, Reconciler, FakeCanaryPods]:
    kube, rec = ready_model()
    for name in ("tiny-a-1", "tiny-a-2"):
        kube.create("pods", NS, serving_pod(name))
    pods = FakeCanaryPods()
    return kube, Reconciler(kube, config=rec.config, canary=pods), pods


def _status(kube: FakeKube) -> dict[str, Any]:
    obj = kube.get("packratmodels", NS, "tiny")
    assert obj is not None
    status: dict[str, Any] = obj.get("status") or {}
    return status


def test_canary_objects_then_the_split_then_the_counts() -> None:
    kube, rec, pods = _setup()
    set_spec(kube, canary={"model": V2, "trafficPercent": 25})
    rec.reconcile(NS, "tiny", now=T0)
    assert {"tiny-canary"} <= set(kube.of("deployments")) and "tiny-canary" in kube.of("services")
    assert "tiny-canary-plan" in kube.of("configmaps")
    dep = kube.get("deployments", NS, "tiny-canary")
    assert dep is not None
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["packrat.dev/slot"] == "canary"  # never selected by the model's Service
    service = kube.get("services", NS, "tiny")
    assert service is not None and service["spec"]["selector"]["packrat.dev/slot"] == "a"
    assert pods.told == []  # not before the canary's pods are ready
    assert _status(kube)["canary"]["phase"] == "Starting"

    kube.make_ready("tiny-canary")
    ident = canary_settings({"canary": {"model": V2, "trafficPercent": 25}}).hash  # type: ignore[union-attr]
    pods.report = {"url": URL.replace(".ns.", f".{NS}."), "id": ident, "served": 40}
    pods.report |= {"errors": 2, "p99Ms": 12.5}
    res = rec.reconcile(NS, "tiny", now=T0)
    urls, target, percent = pods.told[-1]
    assert _status(kube)["canary"]["requests"] == 2 * 42  # summed over both stable pods
    assert sorted(urls) == ["http://tiny-a-1:8080", "http://tiny-a-2:8080"]
    assert target == URL.replace(".ns.", f".{NS}.") and percent == 25
    canary = _status(kube)["canary"]
    assert canary["phase"] == "Progressing" and canary["trafficPercent"] == 25
    assert res.waiting  # looked at again every poll interval while it runs


def test_counts_are_untrusted_input() -> None:
    me = {"url": URL, "id": "v2"}
    good = _json({"canary": {**me, "served": 10, "errors": 1, "p99Ms": 5.0}})
    worse = _json({"canary": {**me, "served": 5, "errors": 0, "p99Ms": 9.0}})
    other = _json({"canary": {"url": "http://old/predictions/x", "served": 999}})
    older = _json({"canary": {"url": URL, "id": "v1", "served": 999, "p99Ms": 1e6}})
    junk = [
        _json({"canary": {**me, "served": -5, "errors": "many", "p99Ms": 1e12}}),
        _json({"canary": "x"}),
        _json({"canary": {**me, "served": 100}}, status=500),
        _json({"canary": {**me, "served": True}}),
        _json([{"canary": {**me, "served": 100}}]),
        Answer(200, b'{"canary": {"url": "' + URL.encode() + b'", "id": "v2", "served": 1e999}}'),
        Answer(0, error="unreachable"),
    ]
    seen = aggregate([good, worse, other, older, *junk], url=URL, ident="v2")
    assert (seen.requests, seen.errors, seen.p99_ms) == (16, 1, 9.0)


@pytest.mark.parametrize(
    ("rollback", "requests", "errors", "p99", "why"),
    [
        ({"maxErrorRate": 0.05}, 100, 6, 1.0, "error rate"),
        ({"maxErrorRate": 0.05}, 100, 5, 1.0, None),
        ({"maxP99Ms": 50}, 100, 0, 51.0, "P99"),
        ({"maxP99Ms": 50, "minRequests": 200}, 100, 0, 500.0, None),  # too few yet
        ({}, 100, 100, 1e6, None),  # no thresholds: never by itself
    ],
)
def test_thresholds(
    rollback: dict[str, Any], requests: int, errors: int, p99: float, why: str | None
) -> None:
    from packrat.controller.switch.canary import Observed

    settings = canary_settings(
        {"canary": {"model": V2, "trafficPercent": 10, "rollback": rollback}}
    )
    assert settings is not None
    got = crossed(settings, Observed(requests=requests, errors=errors, p99_ms=p99))
    assert (got is None) if why is None else (why in str(got))


def test_automatic_rollback_stops_the_split_before_deleting() -> None:
    kube, rec, pods = _setup()
    canary = {"model": V2, "trafficPercent": 50, "rollback": {"maxErrorRate": 0.1}}
    set_spec(kube, canary=canary)
    rec.reconcile(NS, "tiny", now=T0)
    kube.make_ready("tiny-canary")
    target = URL.replace(".ns.", f".{NS}.")
    ident = canary_settings({"canary": canary}).hash  # type: ignore[union-attr]
    pods.report = {"url": target, "id": ident, "served": 30, "errors": 20, "p99Ms": 3.0}
    rec.reconcile(NS, "tiny", now=T0)
    assert [t[2] for t in pods.told] == [50, 0]  # told, then stopped, in this pass
    assert "tiny-canary" not in kube.of("deployments") and "tiny-canary" not in kube.of("services")
    state = _status(kube)["canary"]
    assert state["phase"] == "RolledBack" and "error rate" in state["message"]
    # it stays rolled back: the next passes start nothing
    rec.reconcile(NS, "tiny", now=T0)
    assert "tiny-canary" not in kube.of("deployments")
    assert _status(kube)["canary"]["phase"] == "RolledBack"
    # a new canary model is a new canary
    set_spec(kube, canary={**canary, "model": {**V2, "sampleContentType": "application/x-v3"}})
    rec.reconcile(NS, "tiny", now=T0)
    assert "tiny-canary" in kube.of("deployments")
    assert _status(kube)["canary"]["phase"] == "Starting"


def test_removal_waits_for_every_stable_pod() -> None:
    kube, rec, pods = _setup()
    set_spec(kube, canary={"model": V2, "trafficPercent": 20})
    rec.reconcile(NS, "tiny", now=T0)
    kube.make_ready("tiny-canary")
    rec.reconcile(NS, "tiny", now=T0)
    set_spec(kube, canary=None)
    pods.refuse = {"http://tiny-a-2:8080"}
    res = rec.reconcile(NS, "tiny", now=T0)
    assert pods.told[-1][2] == 0
    assert "tiny-canary" in kube.of("deployments")  # tiny-a-2 may still send to it
    assert res.waiting and "stopping" in _status(kube)["canary"]["message"]
    pods.refuse = set()
    rec.reconcile(NS, "tiny", now=T0)
    assert "tiny-canary" not in kube.of("deployments") and "canary" not in _status(kube)
    assert "tiny-canary-plan" not in kube.of("configmaps")


@pytest.mark.parametrize(
    ("canary", "message"),
    [
        ({"trafficPercent": 10}, "spec.canary.model is required"),
        ({"model": V2, "trafficPercent": 101}, "trafficPercent must be an integer in 0..100"),
        ({"model": {"zoo": "nope"}, "trafficPercent": 1}, "spec.canary.model.zoo must be one of"),
        ({"model": {"zoo": "tiny"}, "trafficPercent": 1}, "a canary serves a different model"),
        ({"model": V2, "trafficPercent": 1, "rollback": {"maxErrorRate": 2}}, "maxErrorRate"),
        ({"model": V2, "trafficPercent": 1, "rollback": {"maxP99Ms": 0}}, "maxP99Ms"),
        ({"model": V2, "trafficPercent": 1, "weight": 3}, "spec.canary.weight: unknown field"),
    ],
)
def test_bad_canary_is_refused(canary: Mapping[str, Any], message: str) -> None:
    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2, "canary": canary}
    errors = validate_spec(spec, name="tiny")
    assert any(message in e for e in errors), errors


def test_the_documented_canary_is_valid() -> None:
    """docs/canary.md's manifest passes the CRD's schema and the operator's validation."""
    import re

    import yaml
    from openapi_schema_validator import OAS30Validator
    from packaging_support import DOCS_DIR, crd_schema, strict_schema

    text = (DOCS_DIR / "canary.md").read_text(encoding="utf-8")
    (manifest,) = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]
    assert manifest["kind"] == "PackratModel" and "canary" in manifest["spec"]
    schema = strict_schema(crd_schema())
    schema["properties"]["metadata"] = {"type": "object"}
    assert list(OAS30Validator(schema).iter_errors(manifest)) == []
    assert validate_spec(manifest["spec"], name=manifest["metadata"]["name"]) == []
