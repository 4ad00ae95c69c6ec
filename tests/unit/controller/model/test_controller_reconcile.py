"""The reconcile state machine against an in-memory API: profile, deploy, switch, abort, retry."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import yaml
from kube_support import NS, T0, ModelSetUp, merge, profile_json, set_spec, setup_model
from openapi_schema_validator import OAS30Validator
from packaging_support import ROOT, strict_schema

from packrat.controller.api.drift import merge_patch
from packrat.controller.core.pods import pod_failure
from packrat.controller.core.status import get_condition
from packrat.controller.model.reconcile import Config, Reconciler


def test_merge_patch_removes_nested_keys() -> None:
    old = {"a": {"b": 1, "c": 2}, "d": 1, "e": [1]}
    new = {"a": {"b": 1}, "e": [2]}
    patch = merge_patch(old, new)
    assert patch == {"a": {"c": None}, "d": None, "e": [2]}
    assert merge(old, patch) == new


def test_profile_then_deploy_then_ready(new_model: ModelSetUp) -> None:
    kube, rec = new_model
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Profiling"
    assert kube.of("jobs") == [kube.of("jobs")[0]]
    job_name = kube.of("jobs")[0]
    assert job_name.startswith("tiny-profile-")
    assert kube.of("deployments") == []
    # a second pass does not create a second Job
    rec.reconcile(NS, "tiny", now=T0)
    assert [c for c in kube.creates if c[0] == "jobs"] == [("jobs", job_name)]

    kube.finish_job(ok=True, log=profile_json())
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Deploying"
    # the profile, and the slot's plan (its pods read it at start), and the admin token
    assert sorted(kube.of("configmaps")) == sorted([job_name, "tiny-a-plan"])
    assert kube.of("secrets") == ["tiny-admin-token"]
    assert kube.of("jobs") == []
    assert kube.of("deployments") == ["tiny-a"]
    svc = kube.get("services", NS, "tiny")
    assert svc is not None and svc["spec"]["selector"]["packrat.dev/slot"] == "a"
    status = kube.prm()["status"]
    assert status["plan"]["batch"] == 4 and status["plan"]["label"]
    assert status["profile"]["configMap"] == job_name
    assert status["profile"]["cpuModel"] == "Test CPU"

    kube.make_ready("tiny-a")
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Ready"
    status = kube.prm()["status"]
    ready = get_condition(status["conditions"], "Ready")
    assert ready is not None and ready["status"] == "True"
    assert status["readyReplicas"] == 1
    assert status["endpoint"] == {"service": "tiny.ns.svc", "port": 8080}
    assert ("Normal", "Ready", res.events[-1][2]) == res.events[-1]


def test_invalid_spec_creates_nothing(make_model: Callable[[dict[str, Any]], ModelSetUp]) -> None:
    kube, rec = make_model({"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4, "autoBatch": {}})
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Failed"
    cond = get_condition(kube.prm()["status"]["conditions"], "Ready")
    assert cond is not None and cond["reason"] == "InvalidSpec"
    assert "exactly one of batchSize and autoBatch" in cond["message"]
    assert kube.creates == [("packratmodels", "tiny")]


def test_replicas_change_in_place(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, replicas=3)
    res = rec.reconcile(NS, "tiny", now=T0)
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == 3  # type: ignore[index]
    assert kube.of("deployments") == ["tiny-a"]
    assert res.phase == "Deploying"
    assert "switch" not in kube.prm()["status"]


def test_switch_completes_once_even_after_restart(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Reconfiguring"
    assert kube.of("deployments") == ["tiny-a", "tiny-b"]
    assert kube.prm()["status"]["switch"]["stage"] == "rollout"
    # not ready yet: nothing moves
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=5))
    assert kube.get("services", NS, "tiny")["spec"]["selector"]["packrat.dev/slot"] == "a"  # type: ignore[index]
    kube.make_ready("tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=6))
    assert kube.get("services", NS, "tiny")["spec"]["selector"]["packrat.dev/slot"] == "b"  # type: ignore[index]
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == 1  # type: ignore[index]
    status = kube.prm()["status"]
    assert status["switch"]["stage"] == "draining"
    assert status["activeSlot"] == "b"
    # operator restarted: a fresh Reconciler finishes the switch exactly once
    rec2 = Reconciler(kube, config=Config(image="img"))
    res = rec2.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=8))
    assert res.switch_result is None  # still draining
    res = rec2.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=12))
    assert res.switch_result == "succeeded"
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == 0  # type: ignore[index]
    status = kube.prm()["status"]
    assert status["lastSwitch"]["result"] == "Succeeded"
    assert status["plan"]["batch"] == 8
    assert "switch" not in status
    res = rec2.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=13))
    assert res.switch_result is None and res.phase == "Ready"
    assert kube.get("services", NS, "tiny")["spec"]["selector"]["packrat.dev/slot"] == "b"  # type: ignore[index]


def test_switch_aborts_and_keeps_serving(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=61))
    assert res.switch_result == "aborted"
    assert res.phase == "Ready"
    assert any(e[1] == "SwitchAborted" and e[0] == "Warning" for e in res.events)
    assert kube.get("deployments", NS, "tiny-b")["spec"]["replicas"] == 0  # type: ignore[index]
    assert kube.get("services", NS, "tiny")["spec"]["selector"]["packrat.dev/slot"] == "a"  # type: ignore[index]
    status = kube.prm()["status"]
    assert status["lastSwitch"]["result"] == "Aborted"
    cond = get_condition(status["conditions"], "Reconfiguring")
    assert cond is not None and cond["reason"] == "SwitchAborted"
    # no retry loop for the same spec
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=200))
    assert res.switch_result is None
    assert kube.get("deployments", NS, "tiny-b")["spec"]["replicas"] == 0  # type: ignore[index]
    # a new spec tries again
    set_spec(kube, batchSize=2)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=201))
    assert res.phase == "Reconfiguring"
    assert kube.get("deployments", NS, "tiny-b")["spec"]["replicas"] == 1  # type: ignore[index]


def test_profiling_failure_retries_with_backoff_then_fails(new_model: ModelSetUp) -> None:
    kube, rec = new_model
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=False, message="Killed\nout of memory")
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Profiling"
    cond = get_condition(kube.prm()["status"]["conditions"], "Profiled")
    assert cond is not None and cond["reason"] == "ProfilingRetry"
    assert "OOMKilled" in cond["message"] and "out of memory" in cond["message"]
    assert kube.of("jobs") == []
    # backoff: no new Job before retryAt
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=5))
    assert kube.of("jobs") == []
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=11))
    assert len(kube.of("jobs")) == 1
    kube.objects = {k: v for k, v in kube.objects.items() if k[0] != "pods"}
    kube.finish_job(ok=False)
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=12))
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=40))
    kube.objects = {k: v for k, v in kube.objects.items() if k[0] != "pods"}
    kube.finish_job(ok=False)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=41))
    assert res.phase == "Failed"
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=4000))
    assert res.phase == "Failed"
    assert kube.of("jobs") == []
    cond = get_condition(kube.prm()["status"]["conditions"], "Profiled")
    assert cond is not None and cond["reason"] == "ProfilingFailed"


def test_profile_reused_for_batch_change(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    profiles = [c for c in kube.of("configmaps") if "-profile-" in c]
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)
    assert [c for c in kube.of("configmaps") if "-profile-" in c] == profiles
    assert kube.of("jobs") == []


def test_written_status_matches_the_crd_schema(
    served_model: ModelSetUp, new_model: ModelSetUp
) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "packratmodel.yaml").read_text())
    status_schema = strict_schema(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    )
    validator = OAS30Validator(status_schema)
    kube, rec = new_model
    rec.reconcile(NS, "tiny", now=T0)
    validator.validate(kube.prm()["status"])  # profiling
    kube.finish_job(ok=False, message="boom")
    rec.reconcile(NS, "tiny", now=T0)
    validator.validate(kube.prm()["status"])  # retry pending
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)
    validator.validate(kube.prm()["status"])  # mid-switch
    kube.make_ready("tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=30))
    status = kube.prm()["status"]
    validator.validate(status)  # after the switch
    assert status["plan"]["expectedSpeedup"] is not None


def test_spec_change_after_exhausted_profiling_retries(new_model: ModelSetUp) -> None:
    kube, rec = new_model
    now = T0
    for _ in range(3):
        rec.reconcile(NS, "tiny", now=now)
        kube.objects = {k: v for k, v in kube.objects.items() if k[0] != "pods"}
        kube.finish_job(ok=False)
        rec.reconcile(NS, "tiny", now=now)
        now += datetime.timedelta(seconds=100)
    assert rec.reconcile(NS, "tiny", now=now).phase == "Failed"
    set_spec(kube, replicas=2)  # any spec change is a new generation
    res = rec.reconcile(NS, "tiny", now=now)
    assert res.phase == "Profiling"
    assert len(kube.of("jobs")) == 1


def test_pod_failure_reasons() -> None:
    pull = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "profile",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}},
                }
            ],
        }
    }
    assert "ImagePullBackOff" in (pod_failure(pull) or "")
    assert pod_failure({"status": {"phase": "Running"}}) is None
    crash = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "publish",
                    "state": {
                        "terminated": {
                            "exitCode": 2,
                            "reason": "Error",
                            "message": "a\nb\nlast line",
                        }
                    },
                }
            ],
        }
    }
    text = pod_failure(crash) or ""
    assert "exit code 2" in text and "last line" in text


def test_auto_batch_replans_for_sustained_estimate(
    make_model: Callable[[dict[str, Any]], ModelSetUp],
) -> None:
    kube, _ = make_model(
        {
            "model": {"zoo": "tiny"},
            "cpus": 2,
            "autoBatch": {"min": 1, "max": 8, "sustainObservations": 2, "minIntervalSeconds": 0},
            "profiling": {"maxBatch": 8},
        }
    )
    estimates = iter([8, 8, 8, 8, 8, 8])
    rec = Reconciler(kube, config=Config(image="img"), estimates=lambda ns, n: next(estimates))
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=profile_json())
    rec.reconcile(NS, "tiny", now=T0)
    assert kube.prm()["status"]["plan"]["batch"] == 1  # starts at autoBatch.min
    kube.make_ready("tiny-a")
    rec.reconcile(NS, "tiny", now=T0)  # Ready, first reading
    assert kube.prm()["status"]["batchSize"]["observed"] == 8
    assert "target" not in kube.prm()["status"]["batchSize"]
    res = rec.reconcile(NS, "tiny", now=T0)  # second equal reading: re-plan
    assert any(e[1] == "BatchSizeChanged" for e in res.events)
    assert kube.prm()["status"]["batchSize"]["target"] == 8
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Reconfiguring"
    assert kube.prm()["status"]["switch"]["plan"]["batch"] == 8


def test_the_operator_serves_a_batch_on_a_faster_larger_plan() -> None:
    """Issue 37 item 7: batch 3 on 2 cores is 5 ms exactly (2+1) but 1.8 ms on the plan for 4
    (2+2, one slot idle); the operator serves the padded plan and its pods get it."""
    import json

    from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint

    lat = {(1, 1): 5.0, (1, 2): 1.8, (2, 1): 4.0, (2, 2): 3.0, (2, 4): 3.5}
    points = tuple(ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in lat.items())
    text = Profile(meta=ProfileMeta(model="tiny", cpu_model="Test CPU", cpus=2), points=points)
    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 3, "profiling": {"maxBatch": 4}}
    kube, rec = setup_model(spec)
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=text.to_json())
    rec.reconcile(NS, "tiny", now=T0)
    plan = kube.prm()["status"]["plan"]
    assert (plan["batch"], plan["capacity"], plan["expectedLatencyMs"]) == (3, 4, 1.8)
    assert plan["instances"] == [{"threads": 1, "batch": 2, "count": 2, "latency_ms": 1.8}]
    cm = kube.get("configmaps", NS, "tiny-a-plan")
    assert cm is not None
    pod_plan = json.loads(next(iter(cm["data"].values())))
    assert pod_plan["batch"] == 3 and pod_plan["capacity"] == 4
