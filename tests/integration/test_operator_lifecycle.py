"""The real operator (kopf subprocess) against the kmock emulator, with a test agent playing the
kubelet and controllers: real ``packrat profile`` Jobs, real ``packrat serve`` Deployments, real
HTTP traffic through the Service.

Scenarios: invalid spec; profile (first Job OOM-killed, retried) -> plan -> serve; switch under
load with zero failures (the timeline is printed and written to ``$PACKRAT_SWITCH_TIMELINE``
when set); operator killed mid-switch; passive slot never ready -> abort; autoBatch reads the
pods' estimate; delete -> everything gone.

Each test passes alone and in any order (``--reverse``, ``--shuffle SEED``): the module's
cluster is shared, and the served model comes from ``served``, which measures it when the
cluster has none (the first test to need it pays for the profile) and brings it back to a
steady base spec before each test. Switch targets are relative to the slot and batch the model
serves when the test starts. No timing assertions; every wait polls a condition with a deadline
sized for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from harness import NAMESPACE, Load, OperatorCluster, wait_for
from models import Served, body, ensure_served, model_events, settle, tiny_spec
from promtext import sample

# the first test to need the served model also pays for its profile and first rollout
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

NAME = "tiny"
# the profile's time budget: the CRD's default is only a cap (a quiet machine measures the grid
# in about 30 s); 30 s measured 2 of 6 points on a loaded machine, and batch 4 had no plan. The
# default ready timeout: a new slot's TorchServe took over 90 s to start on a loaded machine, and
# the switch would abort (the never-ready test sets its own, short one)
SPEC: dict[str, Any] = tiny_spec(4, budget_s=600, batchSize=2)
SLOW = 180.0  # a deadline for anything that takes seconds on a quiet machine
SWITCH_S = SLOW + SPEC["switch"]["readyTimeoutSeconds"]  # a switch: rollout, then the rest


def _oom_first_profiling_pod(cluster: OperatorCluster) -> None:
    cluster.agent.oom_kill_job_pods = 1


@pytest.fixture
def served(cluster: OperatorCluster) -> Served:
    """The model ``tiny``, profiled (its first profiling pod OOM-killed, then retried) and
    served, steady at its base spec."""
    first = ensure_served(cluster, NAME, SPEC, prepare=_oom_first_profiling_pod)
    settle(cluster, NAME, SPEC)
    return first


def _other(slot: str) -> str:
    return "b" if slot == "a" else "a"


def _other_batch(batch: int) -> int:
    return 4 if batch != 4 else 2


def _selector(cluster: OperatorCluster) -> str | None:
    svc = cluster.api.get("services", NAME) or {}
    selector: str | None = (svc.get("spec") or {}).get("selector", {}).get("packrat.dev/slot")
    return selector


def _passes(cluster: OperatorCluster) -> float:
    return sample(cluster.operator.metrics(), "packrat_operator_reconciles_total")


def _after_passes(cluster: OperatorCluster, n: int) -> None:
    """Give the operator ``n`` more passes and wait for each (a negative check, such as "no
    second switch", needs the operator to have had its chance). A model at rest is passed
    over only by the resync (minutes), so each pass is asked for: a harmless annotation
    changes, which wakes the model's daemon as any edit would."""
    for i in range(n):
        start = _passes(cluster)
        nudge = {"metadata": {"annotations": {"test.packrat.dev/nudge": f"{time.time()}-{i}"}}}
        cluster.api.patch("packratmodels", NAME, nudge)
        wait_for(lambda s=start: _passes(cluster) > s, timeout=SLOW, what=f"operator pass {i}")


def test_operator_rejects_invalid_spec(cluster: OperatorCluster) -> None:
    cluster.api.create("packratmodels", body("bad", {**SPEC, "autoBatch": {"max": 4}}))
    wait_for(
        lambda: cluster.status("bad").get("phase") == "Failed", timeout=SLOW, what="bad -> Failed"
    )
    ready = cluster.condition("bad", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "exactly one of batchSize and autoBatch" in ready["message"]
    bad_uid = cluster.model("bad")["metadata"]["uid"]
    assert [e for e in model_events(cluster, bad_uid, "InvalidSpec") if e["type"] == "Warning"]
    for resource in ("jobs", "deployments", "services", "configmaps"):
        assert cluster.api.list(resource, {"app.kubernetes.io/instance": "bad"}) == []
    cluster.api.delete("packratmodels", "bad")
    wait_for(
        lambda: cluster.api.get("packratmodels", "bad") is None, timeout=SLOW, what="bad deleted"
    )


def test_operator_watches_only_its_own_children(cluster: OperatorCluster) -> None:
    """Every child watch asks the API server for our labels only (issue 29 item 4): unrelated
    ConfigMaps reach the operator not at all, one of ours does."""
    emulator = cluster.emulator.emulator
    assert emulator is not None
    ours = "app.kubernetes.io/managed-by=packrat-operator"
    want = {
        "deployments": ours,
        "services": ours,
        "jobs": ours,
        "configmaps": ours,
        "pods": "app.kubernetes.io/name=packrat-profiling",
    }

    def selectors() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for path, asked in emulator.watch_selectors.items():
            found.setdefault(path.rsplit("/", 1)[-1], set()).update(asked)
        return found

    wait_for(lambda: set(want) <= set(selectors()), timeout=SLOW, what="the operator's watches")
    assert {plural: selectors()[plural] for plural in want} == {p: {s} for p, s in want.items()}

    def seen() -> int:
        return sum(
            n
            for (path, agent), n in emulator.watch_events.items()
            if path.endswith("/configmaps") and agent != "Python-urllib"
        )

    before = seen()
    for i in range(20):
        cluster.api.create("configmaps", {"metadata": {"name": f"unrelated-{i}"}, "data": {}})
    labels = {"app.kubernetes.io/managed-by": "packrat-operator"}
    cluster.api.create("configmaps", {"metadata": {"name": "ours-probe", "labels": labels}})
    # events arrive in order: once ours is seen, the unrelated ones would have been too
    wait_for(lambda: seen() > before, timeout=SLOW, what="our ConfigMap's watch event")
    assert seen() == before + 1
    for name in ["ours-probe", *(f"unrelated-{i}" for i in range(20))]:
        cluster.api.delete("configmaps", name)


def test_operator_profiles_retries_and_serves(cluster: OperatorCluster, served: Served) -> None:
    # what the first pass did, recorded when the model first became Ready
    failures = [e for e in served.events if e.get("reason") == "ProfilingFailed"]
    assert failures, served.events
    assert failures[0]["type"] == "Warning"
    assert "OOMKilled" in failures[0]["message"] and "exit code 137" in failures[0]["message"]
    started = [e for e in served.events if e.get("reason") == "ProfilingStarted"]
    # one start per attempt, no duplicates: the first attempt is OOM-killed (injected), and
    # on a busy machine a later attempt may measure busy cores, which the Job refuses to
    # store ("contaminated", exit 2: right on a dedicated node); the operator retries that
    # like any failed attempt, so each start after the first answers exactly one failure
    assert len(started) == len(failures) + 1, [e["message"] for e in served.events]
    assert all("contaminated" in f["message"] for f in failures[1:]), failures
    attempts = sorted(int(e["message"].rsplit("attempt ", 1)[1].rstrip(")")) for e in started)
    assert attempts == list(range(1, len(started) + 1))  # no attempt started twice
    assert served.jobs == []  # cleaned up after success
    first = served.status
    assert first["plan"]["batch"] == SPEC["batchSize"] and first["plan"]["label"]
    assert first["activeSlot"] == "a"
    assert first["readyReplicas"] == 1
    assert first["endpoint"] == {"service": f"{NAME}.{NAMESPACE}.svc", "port": 8080}
    ready = {c["type"]: c for c in first["conditions"]}
    assert ready["Ready"]["status"] == "True" and ready["Ready"]["reason"] == "Ready"
    assert ready["Profiled"]["status"] == "True"
    profiled = sample(served.metrics, "packrat_operator_profiling_duration_seconds_count")
    assert (
        profiled
        - sample(served.metrics_before, "packrat_operator_profiling_duration_seconds_count")
        == 1
    )
    assert sample(served.metrics, "packrat_model_expected_speedup", model=NAME) > 0

    # what holds now, in the steady base state
    status = cluster.status(NAME)
    # the profile: measured by a real packrat profile Job, stored in an owned ConfigMap
    cm_name = status["profile"]["configMap"]
    assert cm_name == first["profile"]["configMap"] and cm_name.startswith(f"{NAME}-profile-")
    cm = cluster.api.get("configmaps", cm_name)
    assert cm is not None
    profile = json.loads(cm["data"]["profile.json"])
    assert profile["format"] == "packrat.profile/v2"
    assert profile["points"]
    assert {p["threads"] for p in profile["points"]} <= {1, 2}
    assert profile["meta"]["cpus"] == 2
    assert cm["metadata"]["labels"]["packrat.dev/model"] == NAME
    assert cm["metadata"]["ownerReferences"][0]["kind"] == "PackratModel"
    assert status["observedGeneration"] == cluster.model(NAME)["metadata"]["generation"]
    active = status["activeSlot"]
    svc = cluster.api.get("services", NAME)
    assert svc is not None and svc["spec"]["selector"]["packrat.dev/slot"] == active
    dep = cluster.api.get("deployments", f"{NAME}-{active}")
    assert dep is not None
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["PACKRAT_PLAN"]["valueFrom"]["configMapKeyRef"]  # the slot's plan ConfigMap
    plan_cm = cluster.api.get("configmaps", ref["name"])
    assert plan_cm is not None and ref["name"] == f"{NAME}-{active}-plan"
    assert json.loads(plan_cm["data"][ref["key"]])["batch"] == status["plan"]["batch"]
    # real inference through the Service
    code, answer = cluster.predict(NAME, NAME)
    assert code == 200, answer
    assert isinstance(answer, list) and len(answer) == 4
    assert cluster.operator.healthy()


def test_operator_switch_under_load_zero_failures(cluster: OperatorCluster, served: Served) -> None:
    before = cluster.status(NAME)
    source, batch = before["activeSlot"], _other_batch(before["plan"]["batch"])
    target = _other(source)
    switches_before = sample(
        cluster.operator.metrics(), "packrat_operator_switches_total", result="succeeded"
    )
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 20, timeout=SLOW, what="load warm-up")
        t0 = time.monotonic()
        cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": batch}})
        marks: dict[str, float] = {}

        def progress() -> bool:
            now = time.monotonic()
            new = cluster.api.get("deployments", f"{NAME}-{target}") or {}
            if "ready" not in marks and (new.get("status") or {}).get("readyReplicas", 0) >= 1:
                marks["ready"] = now
            if "switch" not in marks and _selector(cluster) == target:
                marks["switch"] = now
            old = cluster.api.get("deployments", f"{NAME}-{source}") or {}
            gone = (old.get("spec") or {}).get("replicas") == 0 and not cluster.agent.running(
                f"{NAME}-{source}"
            )
            if "switch" in marks and "gone" not in marks and gone:
                marks["gone"] = now
            return (
                "gone" in marks
                and cluster.status(NAME).get("lastSwitch", {}).get("result") == "Succeeded"
            )

        wait_for(progress, timeout=SWITCH_S, what=f"switch to slot {target}", period=0.05)
        # keep the load on until the new slot has answered a few requests of its own
        served_after = len(load.results)
        wait_for(
            lambda: len(load.results) >= served_after + 10,
            timeout=SLOW,
            what="requests served by the new slot",
        )
        t_end = time.monotonic()
    served_n, failed = load.served_between(t0, t_end)
    status = cluster.status(NAME)
    timeline = {
        "passive_ready_s": round(marks["ready"] - t0, 2),
        "selector_switch_s": round(marks["switch"] - t0, 2),
        "old_slot_gone_s": round(marks["gone"] - t0, 2),
        "requests_served": served_n,
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
    assert served_n > 0
    assert status["activeSlot"] == target
    assert status["plan"]["batch"] == batch
    assert status["lastSwitch"]["fromSlot"] == source and status["lastSwitch"]["toSlot"] == target
    assert "switch" not in status
    assert marks["ready"] <= marks["switch"] <= marks["gone"]
    assert cluster.condition(NAME, "Reconfiguring")["reason"] == "SwitchCompleted"
    assert cluster.api.list("jobs") == []  # the profile was reused, not re-measured
    switches = sample(
        cluster.operator.metrics(), "packrat_operator_switches_total", result="succeeded"
    )
    assert switches == switches_before + 1


def test_operator_restart_mid_switch_completes_once(
    cluster: OperatorCluster, served: Served
) -> None:
    before = cluster.status(NAME)
    target, batch = _other(before["activeSlot"]), _other_batch(before["plan"]["batch"])
    completed_before = len(model_events(cluster, served.uid, "SwitchCompleted"))
    cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": batch}})
    wait_for(
        lambda: (cluster.status(NAME).get("switch") or {}).get("stage") == "rollout",
        timeout=SLOW,
        what="switch rollout",
        period=0.05,
    )
    cluster.operator.kill()
    cluster.operator.start()
    cluster.operator.wait_healthy()
    wait_for(
        lambda: (
            cluster.status(NAME).get("lastSwitch", {}).get("toSlot") == target
            and "switch" not in cluster.status(NAME)
        ),
        timeout=SWITCH_S,
        what=f"switch to slot {target} after the restart",
        period=0.25,
    )
    _after_passes(cluster, 4)  # a double switch would show up now
    status = cluster.status(NAME)
    assert status["activeSlot"] == target and status["plan"]["batch"] == batch
    assert _selector(cluster) == target
    assert len(model_events(cluster, served.uid, "SwitchCompleted")) == completed_before + 1
    deps = sorted(d["metadata"]["name"] for d in cluster.api.list("deployments"))
    assert deps == [f"{NAME}-a", f"{NAME}-b"]
    old = cluster.api.get("deployments", f"{NAME}-{_other(target)}")
    assert old is not None and old["spec"]["replicas"] == 0
    code, _ = cluster.predict(NAME, NAME)
    assert code == 200


def test_operator_passive_never_ready_aborts(cluster: OperatorCluster, served: Served) -> None:
    before = cluster.status(NAME)
    active, passive = before["activeSlot"], _other(before["activeSlot"])
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 10, timeout=SLOW, what="load warm-up")
        # 2Ti fits no node: the passive slot's pod stays Pending, never ready
        cluster.api.patch(
            "packratmodels",
            NAME,
            {
                "spec": {
                    "batchSize": _other_batch(before["plan"]["batch"]),
                    "memory": "2Ti",
                    "switch": {"readyTimeoutSeconds": 6},
                }
            },
        )
        wait_for(
            lambda: cluster.status(NAME).get("lastSwitch", {}).get("result") == "Aborted",
            timeout=SLOW,
            what="aborted switch",
            period=0.25,
        )
        answered = len(load.results)
        wait_for(
            lambda: len(load.results) >= answered + 10,
            timeout=SLOW,
            what="requests served after the abort",
        )
    assert load.failures == [], load.failures[:5]
    status = cluster.status(NAME)
    assert status["activeSlot"] == active and status["phase"] == "Ready"
    assert _selector(cluster) == active
    cond = cluster.condition(NAME, "Reconfiguring")
    assert cond["status"] == "False" and cond["reason"] == "SwitchAborted"
    assert [e for e in model_events(cluster, served.uid, "SwitchAborted") if e["type"] == "Warning"]
    attempt = cluster.api.get("deployments", f"{NAME}-{passive}")
    assert attempt is not None and attempt["spec"]["replicas"] == 0
    wait_for(
        lambda: not cluster.agent.running(f"{NAME}-{passive}"),
        timeout=SLOW,
        what="attempt removed",
    )
    code, _ = cluster.predict(NAME, NAME)
    assert code == 200
    # no retry loop for the same spec
    _after_passes(cluster, 4)
    assert (cluster.status(NAME).get("switch") or {}).get("stage") == "aborted"


def test_operator_auto_batch_reads_estimate(cluster: OperatorCluster, served: Served) -> None:
    # the batch the active slot already serves, now as an automatic batch range: no switch,
    # and the operator reads the serving pods' batch-size estimate
    before = cluster.status(NAME)
    batch = before["plan"]["batch"]
    switches = len(model_events(cluster, served.uid, "SwitchStarted"))
    cluster.api.patch(
        "packratmodels",
        NAME,
        {
            "spec": {
                "batchSize": None,
                "autoBatch": {"min": 2, "max": 4, "sustainObservations": 100},
            }
        },
    )
    seen = wait_for(
        lambda: (
            (cluster.status(NAME).get("batchSize") or {}).get("observedAt")
            and cluster.status(NAME)["batchSize"]
        ),
        timeout=SLOW,
        what="a batch-size reading",
        period=0.25,
    )
    assert 2 <= seen["observed"] <= 4  # the estimate, clamped to the range
    assert seen["current"] == batch
    status = cluster.status(NAME)
    assert status["phase"] == "Ready" and status["activeSlot"] == before["activeSlot"]
    assert len(model_events(cluster, served.uid, "SwitchStarted")) == switches


def test_operator_pods_were_guaranteed(cluster: OperatorCluster, served: Served) -> None:
    # every profiling and serving pod the agent ran had requests == limits everywhere
    assert cluster.agent.qos, "no pods ran"
    assert set(cluster.agent.qos.values()) == {"Guaranteed"}, cluster.agent.qos
    assert any(name.startswith(f"{NAME}-profile-") for name in cluster.agent.qos)
    assert any(name.startswith((f"{NAME}-a-", f"{NAME}-b-")) for name in cluster.agent.qos)


def test_operator_delete_removes_children(cluster: OperatorCluster, served: Served) -> None:
    deployments = cluster.api.list("deployments")
    assert deployments and all(
        "packrat.dev/serving" in d["metadata"].get("finalizers", []) for d in deployments
    )  # the model's delete must let every one go, or the garbage collector waits forever
    cluster.api.delete("packratmodels", NAME)

    def all_gone() -> bool:
        leftovers = [
            (r, o["metadata"]["name"])
            for r in ("deployments", "services", "configmaps", "jobs", "pods")
            for o in cluster.api.list(r)
        ]
        return not leftovers and not cluster.agent.pods

    wait_for(
        lambda: cluster.api.get("packratmodels", NAME) is None, timeout=SLOW, what="model deleted"
    )
    wait_for(all_gone, timeout=SLOW, what="children garbage-collected")
