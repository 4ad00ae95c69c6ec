"""The pool's spec, manifests and placement glue (pure functions, no cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from packrat.controller.core.model import InvalidSpec
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.readings import parse_status
from packrat.controller.pool.reconcile import layout, served_pods
from packrat.controller.pool.spec import Member, members, parse_pool


def _pool(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": {"weightBudget": "64Mi", "memory": "1Gi", **spec},
    }


def _model(name: str, *, pool: str | None = "p", served: str | None = None) -> dict[str, Any]:
    spec = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1}
    out: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
    if pool:
        out["spec"]["pool"] = pool
    if served:
        out["status"] = {"pool": {"name": "p", "pod": served}}
    return out


def test_spec_defaults_and_errors() -> None:
    spec = parse_pool(_pool())
    assert (spec.cpus, spec.replicas, spec.budget_bytes) == (1, 1, 64 << 20)
    assert (spec.policy, spec.mode, spec.engines) == ("lcache", "prefetch", ("eager",))
    with pytest.raises(InvalidSpec) as bad:
        parse_pool(_pool(weightBudget="2Gi", replicas=-1, policy="fifo", extra=1))
    text = str(bad.value)
    for part in ("weightBudget must be below", "spec.replicas", "spec.policy", "spec.extra"):
        assert part in text


def test_members_include_leaving_models_until_their_service_moves() -> None:
    found = members("p", [_model("a"), _model("b", pool=None, served="p-0"), _model("c", pool="q")])
    assert found == [Member("a", "tiny"), Member("b", "tiny", leaving=True)]


def test_layout_places_and_keeps_served_pods_hosting() -> None:
    spec = parse_pool(_pool(replicas=2))
    models = [_model("a"), _model("b", served="p-1"), _model("c", pool=None, served="p-0")]
    found = members("p", models)
    plan = layout(spec, found, served_pods(models, "p"), {})
    assert set(plan.assignment) == {"a", "b"}  # c is leaving: not placed again
    assert "c" in plan.hosting["p-0"]  # but hosted where its Service points
    assert "b" in plan.hosting["p-1"]  # and b stays on its pod until moved
    assert not plan.unplaced


def test_layout_says_why_a_model_cannot_be_placed() -> None:
    spec = parse_pool(_pool())
    invalid = _model("bad")
    del invalid["spec"]["cpus"]
    other = _model("uri")
    other["spec"]["model"] = {"uri": "http://store/m.pt", "format": "torchscript"}
    plan = layout(spec, members("p", [invalid, other]), {}, {})
    assert plan.assignment == {}
    assert "spec.cpus is required" in plan.unplaced["bad"]
    assert "zoo models only" in plan.unplaced["uri"]


def test_layout_says_why_a_model_does_not_fit() -> None:
    spec = parse_pool(_pool(weightBudget="1Mi"))  # the tiny estimate is 2 MiB
    plan = layout(spec, members("p", [_model("a")]), {}, {})
    assert plan.assignment == {} and "a" in plan.unplaced
    measured = {"a": {"pod": "p-0", "fileBytes": 4096}}  # a pod's measurement replaces it
    assert layout(spec, members("p", [_model("a")]), {}, measured).assignment == {"a": "p-0"}


def test_manifests_one_deployment_and_configmap_per_pod() -> None:
    spec = parse_pool(_pool(cpus=2))
    config = pm.pool_config(spec, [("b", "tiny"), ("a", "tiny")])
    assert [m["name"] for m in config["models"]] == ["a", "b"]
    cm = pm.configmap(spec, "p-0", config)
    assert json.loads(cm["data"][pm.CONFIG_KEY])["budget_bytes"] == 64 << 20
    dep = pm.deployment(spec, "p-0", hosting=True, image="img")
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "PackratPool"
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:3] == ["python", "-m", "packrat.serve.pool"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    assert dep["spec"]["replicas"] == 1
    assert pm.deployment(spec, "p-0", hosting=False)["spec"]["replicas"] == 0
    svc = pm.member_service({"metadata": {"name": "a", "uid": "m"}}, pool="p", pod="p-0")
    assert pm.pod_of_service(svc) == "p-0"
    assert svc["spec"]["selector"][pm.LABEL_POOL] == "p"


def test_pod_status_read_as_hostile_input() -> None:
    good = {"resident_bytes": 1, "file_bytes": 2, "requests": 3, "cold_starts": 1,
            "read_bytes": 5, "last_use": 1.7e9}  # fmt: skip
    doc = {
        "models": {
            "a": good,
            "b": {**good, "requests": -1},
            "c": {**good, "last_use": "soon"},
            "x": good,  # not asked for
        }
    }
    got = parse_status("p-0", doc, {"a", "b", "c"})
    assert list(got) == ["a"] and got["a"].record()["lastUse"].endswith("Z")
    assert parse_status("p-0", ["not", "a", "map"], {"a"}) == {}
