"""The reconcile pass under faults, on the in-memory API: what it repairs, what it refuses."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from kube_support import (
    NS,
    T0,
    FakeKube,
    ModelSetUp,
    profile_json,
    set_spec,
)

from packrat.controller.api.drift import covers, quantity
from packrat.controller.core.model import InvalidSpec, parse
from packrat.controller.core.pods import unschedulable
from packrat.controller.core.status import get_condition
from packrat.controller.profiling.profile import _parse
from packrat.plan.profile import ProfileError, parse_profile


def _cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    return dict(get_condition(kube.prm()["status"].get("conditions"), type_) or {})


def _memory(kube: FakeKube, dep: str) -> str:
    obj = kube.get("deployments", NS, dep)
    assert obj is not None
    return str(obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])


def test_last_good_spec_restored_after_an_abort_needs_no_switch(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    good = kube.prm()["status"]["servingHash"]
    set_spec(kube, batchSize=8, memory="2Ti")
    rec.reconcile(NS, "tiny", now=T0)
    reason = kube.prm()["status"]["switch"]["reason"]
    assert "memory 4Gi -> 2Ti" in reason and "batch 4 -> 8" in reason
    later = T0 + datetime.timedelta(seconds=61)
    assert rec.reconcile(NS, "tiny", now=later).switch_result == "aborted"
    # the last good spec again, with other switch timings: nothing to switch to
    set_spec(kube, batchSize=4, memory=None, switch={"readyTimeoutSeconds": 9, "drainSeconds": 0})
    res = rec.reconcile(NS, "tiny", now=later)
    status = kube.prm()["status"]
    assert "switch" not in status and res.phase == "Ready"
    assert status["servingHash"] == good and status["activeSlot"] == "a"
    assert not [e for e in res.events if e[1] == "SwitchStarted"]
    b = kube.get("deployments", NS, "tiny-b")
    assert b is not None and b["spec"]["replicas"] == 0


def test_reprofile_with_the_same_layout_keeps_the_served_plan(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    before = kube.prm()["status"]
    kube.delete("configmaps", NS, before["profile"]["configMap"])  # lost: re-profile
    rec.reconcile(NS, "tiny", now=T0)
    measured = parse_profile(profile_json(), origin="test")
    slower = measured.with_points(
        dataclasses.replace(pt, latency_ms=pt.latency_ms * 1.25) for pt in measured.points
    )
    kube.finish_job(ok=True, log=slower.to_json())
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    assert status["profile"]["digest"] != before["profile"]["digest"]  # a new profile
    # the same pods: no switch, the served plan and hash kept
    assert "switch" not in status and res.phase == "Ready"
    assert status["plan"] == before["plan"]
    assert status["servingHash"] == before["servingHash"]
    assert kube.of("deployments") == ["tiny-a"]


def test_api_error_leaves_status_as_it_was(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    before = kube.prm()["status"]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("HTTP 500")

    kube.list = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=5))
    assert kube.prm()["status"] == before


def test_foreign_service_is_a_conflict_never_adopted(new_model: ModelSetUp) -> None:
    kube, rec = new_model
    theirs = {"metadata": {"name": "tiny"}, "spec": {"selector": {"app": "web"}}}
    kube.create("services", NS, theirs)
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Failed"
    assert kube.of("jobs") == [] and kube.of("deployments") == []
    svc = kube.get("services", NS, "tiny")
    assert svc is not None and svc["spec"]["selector"] == {"app": "web"}
    assert _cond(kube, "OwnershipConflict")["status"] == "True"
    assert ("Warning", "OwnershipConflict") in [(k, r) for k, r, _ in res.events]
    kube.delete("services", NS, "tiny")
    rec.reconcile(NS, "tiny", now=T0)
    assert _cond(kube, "OwnershipConflict")["status"] == "False"
    assert kube.of("jobs")


def test_extra_selector_key_removed_and_drifted_template_put_back(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    kube.patch("services", NS, "tiny", {"spec": {"selector": {"extra": "x"}}})
    dep = kube.get("deployments", NS, "tiny-a")
    assert dep is not None
    container = dep["spec"]["template"]["spec"]["containers"][0]
    edited = {**container, "image": "other:1"}
    kube.patch(
        "deployments", NS, "tiny-a", {"spec": {"template": {"spec": {"containers": [edited]}}}}
    )
    res = rec.reconcile(NS, "tiny", now=T0)
    svc = kube.get("services", NS, "tiny")
    assert svc is not None and "extra" not in svc["spec"]["selector"]
    dep = kube.get("deployments", NS, "tiny-a")
    assert dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "img"
    assert "DriftRepaired" in [r for _, r, _ in res.events]
    kube.make_ready("tiny-a")
    # at rest: nothing more to write
    patches_before = len(kube.objects)
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Ready" and len(kube.objects) == patches_before


def test_superseded_profiling_job_is_deleted(new_model: ModelSetUp) -> None:
    kube, rec = new_model
    rec.reconcile(NS, "tiny", now=T0)
    (first,) = kube.of("jobs")
    set_spec(kube, profiling={"maxBatch": 4})
    rec.reconcile(NS, "tiny", now=T0)
    (second,) = kube.of("jobs")
    assert second != first


def test_unschedulable_profiling_pod_reported_then_failed_after_grace(
    new_model: ModelSetUp,
) -> None:
    kube, rec = new_model
    rec.reconcile(NS, "tiny", now=T0)
    (job,) = kube.of("jobs")
    kube.objects[("pods", NS, f"{job}-x")] = {
        "metadata": {"name": f"{job}-x", "labels": {"job-name": job}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=5))
    assert "Insufficient cpu" in _cond(kube, "Profiled")["message"]
    assert ("Warning", "ProfilingStuck") in [(k, r) for k, r, _ in res.events]
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=61))
    assert res.result == "profiling_failed"
    assert "unschedulable" in kube.prm()["status"]["profile"]["lastFailure"]
    assert kube.of("jobs") == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"memory": "4Gi\n"}, "spec.memory"),
        ({"model": {"zoo": "tiny", "name": "m\n"}}, "spec.model.name"),
        ({"profiling": "fast"}, "spec.profiling"),
        ({"batchSize": None, "autoBatch": {"max": 4, "minGain": "high"}}, "minGain"),
        ({"nodeSelector": {"a": {"deep": [1]}}}, "nodeSelector"),
    ],
)
def test_bad_inputs_become_invalid_spec(change: dict[str, Any], needle: str) -> None:
    spec: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
    spec.update(change)
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(InvalidSpec) as info:
        parse({"metadata": {"name": "m"}, "spec": spec}, default_image="img")
    assert needle in str(info.value)


def test_deeply_nested_profile_is_a_profile_error() -> None:
    with pytest.raises(ProfileError):
        _parse("{" + '"a":[' * 100000 + "]" * 100000 + "}", origin="log")


def test_covers_ignores_defaults_and_compares_quantities() -> None:
    want = {"resources": {"limits": {"memory": "4Gi", "cpu": "2"}}, "ports": [{"port": 1}]}
    have = {
        "resources": {"limits": {"memory": "4096Mi", "cpu": "2000m"}},
        "ports": [{"port": 1, "protocol": "TCP"}],
        "terminationMessagePath": "/dev/termination-log",
    }
    assert covers(have, want)
    assert not covers({**have, "ports": []}, want)
    assert not covers({**have, "resources": {"limits": {"memory": "2Gi", "cpu": "2"}}}, want)
    assert quantity("500m") == quantity("0.5")
    # forms the hand-written parser refused (None): the Kubernetes client's parser reads them
    assert quantity("1e3") == 1000 and quantity("2Ei") == 2 * 2**60
    assert quantity("+1Gi") == 2**30 and quantity("1k") == quantity("1e3")
    assert quantity("abc") is None and quantity("") is None and quantity(None) is None
    assert covers(
        {"resources": {"limits": {"memory": "1e3"}}}, {"resources": {"limits": {"memory": "1k"}}}
    )


def test_unschedulable_reads_the_scheduler_condition() -> None:
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert unschedulable(pod) is None
