"""The real operator (kopf subprocess) against the kmock emulator, with a test agent playing the
kubelet and controllers: real ``packrat profile`` Jobs, real ``packrat serve`` Deployments, real
HTTP traffic through the Service.

The scenarios share one emulator, agent and model and run in file order (each builds on the
state the previous one left): invalid spec; profile (first Job OOM-killed, retried) -> plan ->
serve; switch under load with zero failures (the timeline is printed and written to
``$PACKRAT_SWITCH_TIMELINE`` when set); operator killed mid-switch; passive slot never ready
-> abort; delete -> everything gone. No timing assertions: waits have generous timeouts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "operator"))

from harness import NAMESPACE, Load, OperatorCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NAME = "tiny"
SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "batchSize": 2,
    "maxBatchDelayMs": 2,
    "profiling": {
        "maxBatch": 4,
        "threads": [1, 2],
        "precision": 0.2,
        "timeBudgetSeconds": 30,
        "backoffLimit": 0,
    },
    "switch": {"readyTimeoutSeconds": 90, "drainSeconds": 2},
}


def _body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorCluster]:
    cluster = OperatorCluster(tmp_path_factory.mktemp("operator"))
    try:
        yield cluster
    finally:
        print("\n--- operator log tail ---\n" + cluster.log_tail(40))
        if cluster.agent.errors:
            print("agent errors:", cluster.agent.errors[-5:])
        cluster.close()


def _phase(cluster: OperatorCluster, name: str, phase: str) -> bool:
    return cluster.status(name).get("phase") == phase


def test_operator_rejects_invalid_spec(cluster: OperatorCluster) -> None:
    cluster.api.create("packratmodels", _body("bad", {**SPEC, "autoBatch": {"max": 4}}))
    wait_for(lambda: _phase(cluster, "bad", "Failed"), timeout=30, what="bad -> Failed")
    ready = cluster.condition("bad", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "exactly one of batchSize and autoBatch" in ready["message"]
    assert [e for e in cluster.events("InvalidSpec") if e["type"] == "Warning"]
    for resource in ("jobs", "deployments", "services", "configmaps"):
        assert cluster.api.list(resource, {"app.kubernetes.io/instance": "bad"}) == []
    cluster.api.delete("packratmodels", "bad")
    wait_for(
        lambda: cluster.api.get("packratmodels", "bad") is None, timeout=30, what="bad deleted"
    )


def test_operator_profiles_retries_and_serves(cluster: OperatorCluster) -> None:
    cluster.agent.oom_kill_job_pods = 1  # the first profiling pod is OOM-killed
    cluster.api.create("packratmodels", _body(NAME, SPEC))
    wait_for(lambda: cluster.events("ProfilingFailed"), timeout=60, what="profiling failure event")
    failure = cluster.events("ProfilingFailed")[0]
    assert failure["type"] == "Warning"
    assert "OOMKilled" in failure["message"] and "exit code 137" in failure["message"]
    wait_for(
        lambda: _phase(cluster, NAME, "Ready"),
        timeout=120,
        what=f"{NAME} Ready (log: {cluster.log_tail(5)})",
        period=0.25,
    )
    status = cluster.status(NAME)
    # the profile: measured by a real packrat profile Job, stored in an owned ConfigMap
    cm_name = status["profile"]["configMap"]
    assert cm_name.startswith(f"{NAME}-profile-")
    cm = cluster.api.get("configmaps", cm_name)
    assert cm is not None
    profile = json.loads(cm["data"]["profile.json"])
    assert profile["format"] == "packrat.profile/v1"
    assert profile["points"]
    assert {p["threads"] for p in profile["points"]} <= {1, 2}
    assert profile["meta"]["cpus"] == 2
    assert cm["metadata"]["labels"]["packrat.dev/model"] == NAME
    assert cm["metadata"]["ownerReferences"][0]["kind"] == "PackratModel"
    assert cluster.api.list("jobs") == []  # cleaned up after success
    assert len(cluster.events("ProfilingStarted")) == 2  # one retry, no duplicates
    # the plan and the serving objects
    assert status["plan"]["batch"] == 2 and status["plan"]["label"]
    assert status["activeSlot"] == "a"
    assert status["readyReplicas"] == 1
    assert status["endpoint"] == {"service": f"{NAME}.{NAMESPACE}.svc", "port": 8080}
    assert status["observedGeneration"] == cluster.model(NAME)["metadata"]["generation"]
    ready = cluster.condition(NAME, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Ready"
    assert cluster.condition(NAME, "Profiled")["status"] == "True"
    svc = cluster.api.get("services", NAME)
    assert svc is not None and svc["spec"]["selector"]["packrat.dev/slot"] == "a"
    dep = cluster.api.get("deployments", f"{NAME}-a")
    assert dep is not None
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["PACKRAT_PLAN"])["batch"] == 2
    # real inference through the Service
    code, answer = cluster.predict(NAME, NAME)
    assert code == 200, answer
    assert isinstance(answer, list) and len(answer) == 4
    # operator metrics and liveness
    text = cluster.operator.metrics()
    assert f'packrat_model_expected_speedup{{model="{NAME}",namespace="{NAMESPACE}"}}' in text
    labels = f'model="{NAME}",namespace="{NAMESPACE}"'
    assert f"packrat_operator_profiling_duration_seconds_count{{{labels}}} 1.0" in text
    assert (
        f'packrat_model_phase{{model="{NAME}",namespace="{NAMESPACE}",phase="Ready"}} 1.0' in text
    )
    assert cluster.operator.healthy()


def _selector(cluster: OperatorCluster) -> str | None:
    svc = cluster.api.get("services", NAME) or {}
    selector: str | None = (svc.get("spec") or {}).get("selector", {}).get("packrat.dev/slot")
    return selector


def test_operator_switch_under_load_zero_failures(cluster: OperatorCluster) -> None:
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 20, timeout=30, what="load warm-up")
        t0 = time.monotonic()
        cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": 4}})
        marks: dict[str, float] = {}

        def progress() -> bool:
            now = time.monotonic()
            b = cluster.api.get("deployments", f"{NAME}-b") or {}
            if "ready" not in marks and (b.get("status") or {}).get("readyReplicas", 0) >= 1:
                marks["ready"] = now
            if "switch" not in marks and _selector(cluster) == "b":
                marks["switch"] = now
            a = cluster.api.get("deployments", f"{NAME}-a") or {}
            gone = (a.get("spec") or {}).get("replicas") == 0 and not cluster.agent.running(
                f"{NAME}-a"
            )
            if "switch" in marks and "gone" not in marks and gone:
                marks["gone"] = now
            return (
                "gone" in marks
                and cluster.status(NAME).get("lastSwitch", {}).get("result") == "Succeeded"
            )

        wait_for(progress, timeout=120, what="switch to slot b", period=0.05)
        time.sleep(1.0)  # keep the load on the new slot for a moment
        t_end = time.monotonic()
    served, failed = load.served_between(t0, t_end)
    status = cluster.status(NAME)
    timeline = {
        "passive_ready_s": round(marks["ready"] - t0, 2),
        "selector_switch_s": round(marks["switch"] - t0, 2),
        "old_slot_gone_s": round(marks["gone"] - t0, 2),
        "requests_served": served,
        "requests_failed": failed,
        "operator_timeline": status["lastSwitch"].get("timeline"),
    }
    print("\nswitch timeline:", json.dumps(timeline))
    out = os.environ.get("PACKRAT_SWITCH_TIMELINE")
    if out:
        Path(out).write_text(json.dumps(timeline, indent=2))
    assert load.failures == [], (
        [(round(t - t0, 2), c, m) for t, c, m in load.failures[:5]],
        {k: round(v - t0, 2) for k, v in marks.items()},
        [(round(t - t0, 2), n, port) for t, n, port in cluster.agent.terminations],
    )
    assert served > 0
    assert status["activeSlot"] == "b"
    assert status["plan"]["batch"] == 4
    assert status["lastSwitch"]["fromSlot"] == "a" and status["lastSwitch"]["toSlot"] == "b"
    assert "switch" not in status
    assert marks["ready"] <= marks["switch"] <= marks["gone"]
    assert cluster.condition(NAME, "Reconfiguring")["reason"] == "SwitchCompleted"
    assert cluster.api.list("jobs") == []  # the profile was reused, not re-measured
    labels = f'model="{NAME}",namespace="{NAMESPACE}",result="succeeded"'
    assert f"packrat_operator_switches_total{{{labels}}} 1.0" in cluster.operator.metrics()


def test_operator_restart_mid_switch_completes_once(cluster: OperatorCluster) -> None:
    completed_before = len(cluster.events("SwitchCompleted"))
    cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": 2}})
    wait_for(
        lambda: (cluster.status(NAME).get("switch") or {}).get("stage") == "rollout",
        timeout=30,
        what="switch rollout",
        period=0.05,
    )
    cluster.operator.kill()
    time.sleep(1.0)
    cluster.operator.start()
    wait_for(
        lambda: (
            cluster.status(NAME).get("lastSwitch", {}).get("toSlot") == "a"
            and "switch" not in cluster.status(NAME)
        ),
        timeout=120,
        what="switch back to slot a after the restart",
        period=0.25,
    )
    time.sleep(2.0)  # a double switch would show up now
    status = cluster.status(NAME)
    assert status["activeSlot"] == "a" and status["plan"]["batch"] == 2
    assert _selector(cluster) == "a"
    assert len(cluster.events("SwitchCompleted")) == completed_before + 1
    deps = sorted(d["metadata"]["name"] for d in cluster.api.list("deployments"))
    assert deps == [f"{NAME}-a", f"{NAME}-b"]
    b = cluster.api.get("deployments", f"{NAME}-b")
    assert b is not None and b["spec"]["replicas"] == 0
    code, _ = cluster.predict(NAME, NAME)
    assert code == 200


def test_operator_passive_never_ready_aborts(cluster: OperatorCluster) -> None:
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 10, timeout=30, what="load warm-up")
        # 2Ti fits no node: the passive slot's pod stays Pending, never ready
        cluster.api.patch(
            "packratmodels",
            NAME,
            {"spec": {"batchSize": 4, "memory": "2Ti", "switch": {"readyTimeoutSeconds": 6}}},
        )
        wait_for(
            lambda: cluster.status(NAME).get("lastSwitch", {}).get("result") == "Aborted",
            timeout=60,
            what="aborted switch",
            period=0.25,
        )
        time.sleep(1.0)
    assert load.failures == [], load.failures[:5]
    status = cluster.status(NAME)
    assert status["activeSlot"] == "a" and status["phase"] == "Ready"
    assert _selector(cluster) == "a"
    cond = cluster.condition(NAME, "Reconfiguring")
    assert cond["status"] == "False" and cond["reason"] == "SwitchAborted"
    assert [e for e in cluster.events("SwitchAborted") if e["type"] == "Warning"]
    b = cluster.api.get("deployments", f"{NAME}-b")
    assert b is not None and b["spec"]["replicas"] == 0
    wait_for(lambda: not cluster.agent.running(f"{NAME}-b"), timeout=30, what="attempt removed")
    code, _ = cluster.predict(NAME, NAME)
    assert code == 200
    # no retry loop for the same spec
    time.sleep(2.0)
    assert (cluster.status(NAME).get("switch") or {}).get("stage") == "aborted"


def test_operator_auto_batch_reads_estimate(cluster: OperatorCluster) -> None:
    # back to a spec the active slot already serves, now with an automatic batch range:
    # no switch, and the operator reads the serving pods' batch-size estimate
    switches = len(cluster.events("SwitchStarted"))
    cluster.api.patch(
        "packratmodels",
        NAME,
        {
            "spec": {
                "batchSize": None,
                "memory": None,
                "autoBatch": {"min": 2, "max": 4, "sustainObservations": 100},
            }
        },
    )
    seen = wait_for(
        lambda: (
            (cluster.status(NAME).get("batchSize") or {}).get("observedAt")
            and cluster.status(NAME)["batchSize"]
        ),
        timeout=60,
        what="a batch-size reading",
        period=0.25,
    )
    assert 2 <= seen["observed"] <= 4  # the estimate, clamped to the range
    assert seen["current"] == 2
    status = cluster.status(NAME)
    assert status["phase"] == "Ready" and status["activeSlot"] == "a"
    assert len(cluster.events("SwitchStarted")) == switches


def test_operator_pods_were_guaranteed(cluster: OperatorCluster) -> None:
    # every profiling and serving pod the agent ran had requests == limits everywhere
    assert cluster.agent.qos, "no pods ran"
    assert set(cluster.agent.qos.values()) == {"Guaranteed"}, cluster.agent.qos
    assert any(name.startswith(f"{NAME}-profile-") for name in cluster.agent.qos)
    assert any(name.startswith(f"{NAME}-b-") for name in cluster.agent.qos)


def test_operator_delete_removes_children(cluster: OperatorCluster) -> None:
    cluster.api.delete("packratmodels", NAME)

    def all_gone() -> bool:
        leftovers = [
            (r, o["metadata"]["name"])
            for r in ("deployments", "services", "configmaps", "jobs", "pods")
            for o in cluster.api.list(r)
        ]
        return not leftovers and not cluster.agent.pods

    wait_for(
        lambda: cluster.api.get("packratmodels", NAME) is None, timeout=30, what="model deleted"
    )
    wait_for(all_gone, timeout=60, what="children garbage-collected")
