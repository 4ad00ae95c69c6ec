"""Issue 26, item 5: name squatting. An unowned ``{model}-admin-token`` Secret or
``{model}-{slot}-plan`` ConfigMap is a conflict (a condition and a Warning event), and nothing
that would read it is created: no pod may start with a token an attacker knows or a plan an
attacker wrote. Once the squatter is gone, the model proceeds."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kube_support import NS, T0, FakeKube, ModelSetUp, profile_json

from packrat.controller.core.status import get_condition

SQUATTERS: dict[str, tuple[str, dict[str, Any]]] = {
    "token": (
        "secrets",
        {
            "metadata": {"name": "tiny-admin-token"},
            "data": {"token": base64.b64encode(b"attacker-known-token-0123").decode()},
        },
    ),
    "plan": (
        "configmaps",
        {"metadata": {"name": "tiny-a-plan"}, "data": {"plan": '{"instances": []}'}},
    ),
}


def _cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    return dict(get_condition(kube.prm()["status"].get("conditions"), type_) or {})


@pytest.mark.parametrize("which", sorted(SQUATTERS))
def test_a_squatted_token_or_plan_blocks_the_deployment(which: str, new_model: ModelSetUp) -> None:
    plural, theirs = SQUATTERS[which]
    kube, rec = new_model
    kube.create(plural, NS, theirs)
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=profile_json())
    res = rec.reconcile(NS, "tiny", now=T0)
    name = theirs["metadata"]["name"]
    assert kube.of("deployments") == []  # no pod reads the squatted object
    cond = _cond(kube, "OwnershipConflict")
    assert cond["status"] == "True" and name in cond["message"]
    assert ("Warning", "OwnershipConflict") in [(k, r) for k, r, _ in res.events]
    held = kube.get(plural, NS, name)
    assert held is not None and held["data"] == theirs["data"]  # never adopted or edited
    # the squatter goes: the model proceeds with objects of its own
    kube.delete(plural, NS, name)
    rec.reconcile(NS, "tiny", now=T0)
    assert kube.of("deployments") == ["tiny-a"]
    assert _cond(kube, "OwnershipConflict")["status"] == "False"
    mine = kube.get(plural, NS, name)
    assert mine is not None and mine["data"] != theirs["data"]
