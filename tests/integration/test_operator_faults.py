"""Faults a real cluster throws at a serving model, on the emulator with the real operator.

One model is profiled and served once for the module (``serving``, which any test may be
first to trigger); each test breaks something, waits (with generous deadlines) for the
operator to converge, and leaves the model Ready with its original spec. Repair times and
failed requests are printed (benchmarks/boundaries/controller_faults.py measures them), never
asserted on.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
from harness import TEST_IMAGE, Load, OperatorCluster, wait_for
from models import body, tiny_spec
from seeding import MeasuredProfiles, seed_profile

from packrat.bench.verify import with_verification
from packrat.controller.api.drift import merge_patch
from packrat.controller.core.model import stored
from packrat.controller.serving.manifests import PLAN_KEY, plan_configmap_name
from packrat.plan.optimizer import Optimizer

# the session's profile may be measured in ``serving`` first (minutes on a loaded machine)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

NAME = "f"
# the default ready timeout: fault 3's re-profile may change the plan, and a new slot's
# TorchServe took over 90 s to start on a loaded machine (fault 1 sets its own, short one)
SPEC: dict[str, Any] = tiny_spec(4, budget_s=30, batchSize=2)


def _ready(cluster: OperatorCluster) -> bool:
    status = cluster.status(NAME)
    return status.get("phase") == "Ready" and not status.get("switch")


@pytest.fixture
def serving(cluster: OperatorCluster, tiny_profiles: MeasuredProfiles) -> OperatorCluster:
    """Model ``f`` profiled, serving and at rest with ``SPEC`` (created on first use, with the
    session's measured profile: only fault 3 is about profiling, and it re-profiles)."""
    if cluster.api.get("packratmodels", NAME) is None:
        profile = tiny_profiles.profile(SPEC["profiling"]["maxBatch"])
        cluster.api.create("packratmodels", body(NAME, SPEC))
        seed_profile(cluster, NAME, profile)
    wait_for(
        lambda: _ready(cluster),
        timeout=600,
        what=f"{NAME} Ready (log: {cluster.log_tail(5)})",
        period=0.25,
    )
    wait_for(lambda: cluster.predict(NAME, NAME)[0] == 200, timeout=120, what="serving")
    return cluster


def _restore(cluster: OperatorCluster) -> None:
    """Put ``SPEC`` back exactly: a merge patch of ``SPEC`` alone would keep the keys a test
    added (a ``memory`` that fits no node would then start a switch that never ends)."""
    spec = cluster.model(NAME)["spec"]
    cluster.api.patch("packratmodels", NAME, {"spec": merge_patch(spec, SPEC)})
    wait_for(lambda: _ready(cluster), timeout=600, what=f"{NAME} back at rest", period=0.25)


def _serving_again_after(load: Load, start: float) -> float | None:
    """Seconds from ``start`` to the first success after the last failure."""
    failures = [t for t, code in load.results if t >= start and code != 200]
    if not failures:
        return 0.0
    after = [t for t, code in load.results if t > failures[-1] and code == 200]
    return (after[0] - start) if after else None


def _template(cluster: OperatorCluster, name: str) -> dict[str, Any]:
    dep = cluster.api.get("deployments", name) or {}
    template: dict[str, Any] = (dep.get("spec") or {}).get("template") or {}
    return template


def _memory(cluster: OperatorCluster, name: str) -> str | None:
    containers = (_template(cluster, name).get("spec") or {}).get("containers") or [{}]
    memory: str | None = containers[0].get("resources", {}).get("limits", {}).get("memory")
    return memory


def _deployments(cluster: OperatorCluster) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in cluster.api.list("deployments")}


def _start_failing_switch(cluster: OperatorCluster) -> None:
    # 2Ti fits no node: the passive slot never becomes ready (the plan stays: a profile
    # measured on a busy machine may lack the points of a larger batch)
    cluster.api.patch(
        "packratmodels",
        NAME,
        {"spec": {"memory": "2Ti", "switch": {"readyTimeoutSeconds": 300}}},
    )
    wait_for(
        lambda: (cluster.status(NAME).get("switch") or {}).get("stage") == "rollout",
        timeout=60,
        what="switch under way",
    )


def test_fault1_active_deleted_during_failing_switch(serving: OperatorCluster) -> None:
    """kubectl delete (background) of the active Deployment while a switch that can never
    succeed is under way: the deleted Deployment's pods keep serving (our finalizer holds it),
    the last good configuration is rendered into the other slot, the Service moves once that
    is ready, and only then does the deleted one go. No request fails."""
    cluster = serving
    before = cluster.status(NAME)
    good_hash, active = before["servingHash"], before["activeSlot"]
    other = "b" if active == "a" else "a"
    assert "packrat.dev/serving" in _deployments(cluster)[f"{NAME}-{active}"]["metadata"].get(
        "finalizers", []
    )
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 10, timeout=60, what="load warm-up")
        _start_failing_switch(cluster)
        start = time.monotonic()
        cluster.api.delete("deployments", f"{NAME}-{active}")
        # held while its pods serve: marked deleted, still there, the Service still on it
        deleted = cluster.api.get("deployments", f"{NAME}-{active}")
        assert deleted is not None and deleted["metadata"].get("deletionTimestamp")
        wait_for(
            lambda: cluster.status(NAME).get("lastSwitch", {}).get("result") == "Aborted",
            timeout=120,
            what="the failing switch aborted",
        )

        def failed_over() -> bool:
            status = cluster.status(NAME)
            return (
                status.get("activeSlot") == other
                and status.get("phase") == "Ready"
                and set(_deployments(cluster)) == {f"{NAME}-{other}"}
            )

        # the other slot's new pods start like any pod (minutes on a busy machine)
        wait_for(failed_over, timeout=900, what=f"failed over to slot {other}", period=0.5)
        wait_for(lambda: len(load.results) > 10 + len(load.failures), timeout=60, what="load")
        end = time.monotonic()
    status = cluster.status(NAME)
    assert status["servingHash"] == good_hash
    assert status["servingSpec"]["memory"] == "4Gi"
    assert _memory(cluster, f"{NAME}-{other}") == "4Gi"
    assert not [d for d in _deployments(cluster).values() if d["metadata"].get("deletionTimestamp")]
    served, failed = load.served_between(start, end)
    print(f"\nfault 1: {served} requests served, {failed} failed during the fault")
    assert load.failures == [], load.failures[:5]
    assert served > 0
    _restore(cluster)


def test_fault1_active_deleted_in_the_foreground(serving: OperatorCluster) -> None:
    """kubectl delete --cascade=foreground: the garbage collector deletes the pods first, so
    nothing can be protected; the finalizer is let go at once and the slot is recreated from
    the last good configuration as soon as the old one is gone."""
    cluster = serving
    before = cluster.status(NAME)
    good_hash, active = before["servingHash"], before["activeSlot"]
    _start_failing_switch(cluster)
    cluster.api.delete("deployments", f"{NAME}-{active}", propagation="Foreground")
    dep_name = f"{NAME}-{active}"

    def recreated() -> bool:
        dep = cluster.api.get("deployments", dep_name)
        return dep is not None and not dep["metadata"].get("deletionTimestamp")

    wait_for(recreated, timeout=300, what="deleted in the foreground, then recreated")
    assert _memory(cluster, dep_name) == "4Gi"
    # the pods' hash label is the template's (the plan's cores, not the plan: the slot's plan
    # ConfigMap holds that), of the last good configuration
    spec, plan = before["servingSpec"], before["plan"]
    pod_hash = stored({"name": NAME}, spec, image=TEST_IMAGE).template_hash(plan["cpus"])
    assert _template(cluster, dep_name)["metadata"]["labels"]["packrat.dev/serving-hash"] == (
        pod_hash
    )
    wait_for(lambda: cluster.status(NAME).get("phase") == "Ready", timeout=900, what="Ready")
    wait_for(lambda: cluster.predict(NAME, NAME)[0] == 200, timeout=120, what="serving")
    status = cluster.status(NAME)
    assert status["activeSlot"] == active and status["servingHash"] == good_hash
    _restore(cluster)


def test_fault3_service_deleted_during_reprofile(serving: OperatorCluster) -> None:
    cluster = serving
    cm_name = cluster.status(NAME)["profile"]["configMap"]
    with Load(cluster, NAME, NAME) as load:
        wait_for(lambda: len(load.results) > 10, timeout=60, what="load warm-up")
        cluster.api.delete("configmaps", cm_name)  # the profile is lost: re-profile
        wait_for(lambda: cluster.api.list("jobs"), timeout=60, what="re-profiling job")
        start = time.monotonic()
        cluster.api.delete("services", NAME)
        wait_for(
            lambda: cluster.api.get("services", NAME) is not None,
            timeout=60,
            what="Service recreated",
        )
        repaired = time.monotonic() - start
        # it came back while the profiling Job still runs: repairs never wait on profiling
        assert cluster.api.list("jobs"), "the Service came back only after profiling"
        wait_for(lambda: cluster.predict(NAME, NAME)[0] == 200, timeout=60, what="serving")
        wait_for(lambda: _ready(cluster), timeout=600, what="re-profiled and at rest")
    again = _serving_again_after(load, start)
    print(f"\nfault 3: Service back after {repaired:.2f}s, serving again after {again}s, ", end="")
    print(f"failed requests {len(load.failures)}")
    assert cluster.api.get("configmaps", cm_name) is not None


def test_fault6_api_errors_leave_status(serving: OperatorCluster) -> None:
    cluster = serving
    emulator = cluster.emulator.emulator
    assert emulator is not None
    before = cluster.model(NAME)
    generation = before["status"]["observedGeneration"]
    failed = emulator.requests_failed
    # every read of the active Deployment fails for a while (wake the model with a spec
    # change that needs no switch: replicas stay, only an annotation moves)
    emulator.fail_next("GET", f"/deployments/{NAME}-a", times=4)
    cluster.api.patch("packratmodels", NAME, {"metadata": {"annotations": {"x": "1"}}})
    phases: list[str] = []
    deadline = time.monotonic() + 120
    while emulator.requests_failed < failed + 4 and time.monotonic() < deadline:
        status = cluster.status(NAME)
        phases.append(status.get("phase", ""))
        assert status.get("observedGeneration") == generation
        time.sleep(0.05)
    assert emulator.requests_failed >= failed + 4, "the operator did not retry"
    assert set(phases) == {"Ready"}, sorted(set(phases))
    wait_for(lambda: _ready(cluster), timeout=60, what="still Ready")
    assert "packrat_operator_reconcile_errors_total" in cluster.operator.metrics()


def test_fault7_template_drift_corrected(serving: OperatorCluster) -> None:
    cluster = serving
    dep_name = f"{NAME}-{cluster.status(NAME).get('activeSlot', 'a')}"
    template = _template(cluster, dep_name)
    container = dict(template["spec"]["containers"][0])
    # kubectl set image / edit env / edit resources
    edited = {
        **container,
        "image": "registry.example/other:1",
        "env": [*container["env"], {"name": "EXTRA", "value": "1"}],
    }
    cluster.api.patch(
        "deployments", dep_name, {"spec": {"template": {"spec": {"containers": [edited]}}}}
    )

    def restored() -> bool:
        now = _template(cluster, dep_name)["spec"]["containers"][0]
        return bool(now["image"] == TEST_IMAGE and now["env"] == container["env"])

    wait_for(restored, timeout=180, what="template drift corrected")
    # the pass posts its Events after its writes: the repair can be seen before its Event
    wait_for(
        lambda: [e for e in cluster.events("DriftRepaired") if e["type"] == "Warning"],
        timeout=60,
        what="a DriftRepaired Warning",
    )
    wait_for(lambda: cluster.predict(NAME, NAME)[0] == 200, timeout=120, what="serving")
    wait_for(lambda: _ready(cluster), timeout=120, what="Ready")


def test_fault2_extra_selector_key_removed(serving: OperatorCluster) -> None:
    cluster = serving
    svc = cluster.api.get("services", NAME)
    assert svc is not None
    want = dict(svc["spec"]["selector"])
    cluster.api.patch("services", NAME, {"spec": {"selector": {"extra": "x"}}})
    wait_for(
        lambda: (cluster.api.get("services", NAME) or {}).get("spec", {}).get("selector") == want,
        timeout=60,
        what="selector back to exactly ours",
    )
    wait_for(lambda: cluster.predict(NAME, NAME)[0] == 200, timeout=60, what="serving")


def test_model_gone_while_the_operator_was_down_lets_its_deployments_go(
    cluster: OperatorCluster, tiny_profiles: MeasuredProfiles
) -> None:
    """A model deleted while no operator runs (its kopf finalizer removed by hand): the
    garbage collector's delete of its Deployment waits on our finalizer, and the restarted
    operator, which has no model to run passes for, still lets it go."""
    name = "gone"
    spec = {**SPEC, "switch": {"readyTimeoutSeconds": 300, "drainSeconds": 0}}
    cluster.api.create("packratmodels", body(name, spec))
    seed_profile(cluster, name, tiny_profiles.profile(SPEC["profiling"]["maxBatch"]))
    dep_name = f"{name}-a"
    wait_for(
        lambda: (
            "packrat.dev/serving"
            in (
                (cluster.api.get("deployments", dep_name) or {})
                .get("metadata", {})
                .get("finalizers")
                or []
            )
        ),
        timeout=300,
        what="the model's Deployment, held by our finalizer",
    )
    cluster.operator.kill()
    try:
        cluster.api.patch("packratmodels", name, {"metadata": {"finalizers": None}})
        cluster.api.delete("packratmodels", name)
        assert cluster.api.get("packratmodels", name) is None

        def held() -> bool:
            dep = cluster.api.get("deployments", dep_name) or {}
            return bool(dep.get("metadata", {}).get("deletionTimestamp"))

        # the garbage collector deleted it; our finalizer holds it (its pods with it)
        wait_for(held, timeout=60, what="the orphaned Deployment deleted and held")
    finally:
        cluster.operator.start()
        cluster.operator.wait_healthy()
    wait_for(
        lambda: (
            not [
                d for d in cluster.api.list("deployments") if d["metadata"]["name"].startswith(name)
            ]
            and not cluster.agent.running(dep_name)
        ),
        timeout=300,
        what="the orphaned Deployment and its pods gone",
    )


def test_a_plan_measured_slower_than_fat_is_not_served(
    cluster: OperatorCluster, tiny_profiles: MeasuredProfiles
) -> None:
    """The seeded profile's verification measured the optimizer's plan slower than the fat
    instance: the operator deploys the fat instance instead, and its condition and one
    Warning event say why. (Unit tests cover status.measured once Ready.)"""
    name = "lose"
    measured = tiny_profiles.profile(SPEC["profiling"]["maxBatch"])
    # latencies that make 2x1t/b1 the optimizer's plan for batch 2 whatever was measured
    synthetic = measured.with_points(
        replace(p, latency_ms=(1.0 + p.batch) / (1 if p.threads == 1 else 1.2))
        for p in measured.points
    )
    plan = Optimizer.for_profile(synthetic, cpus=2, max_batch=2).plan(2)
    assert plan.label == "2x1t/b1"
    record = {
        "measuredAt": "2026-12-04T00:00:00Z",
        "repeats": 5,
        "results": [
            {"batch": 2, "label": plan.label, "plan": plan.to_dict(), "planMs": 3.0,
             "fatMs": 2.0, "speedup": 2.0 / 3.0, "expectedSpeedup": plan.expected_speedup}
        ],
    }  # fmt: skip
    cluster.api.create("packratmodels", body(name, SPEC))
    try:
        seed_profile(cluster, name, with_verification(synthetic, record))
        cond = wait_for(
            lambda: cluster.condition(name, "PlanVerified") or None,
            timeout=300,
            what="the PlanVerified condition",
            detail=lambda: f"status: {cluster.status(name)}\nlog:\n{cluster.log_tail(10)}",
        )
        assert cond["status"] == "False" and cond["reason"] == "SlowerThanFat", cond
        status = cluster.status(name)
        assert status["plan"]["label"] == "1x2t/b2", status["plan"]  # the fat instance
        events = [e for e in cluster.events("PlanSlowerThanFat") if name in str(e)]
        assert len(events) == 1 and events[0]["type"] == "Warning"
        assert "2x1t/b1" in events[0]["message"]
        plan_cm = wait_for(
            lambda: cluster.api.get("configmaps", plan_configmap_name(name, "a")),
            timeout=120,
            what="slot a's plan ConfigMap",
        )
        served = json.loads(plan_cm["data"][PLAN_KEY])  # what the pods start on
        assert [(g["threads"], g["batch"], g["count"]) for g in served["instances"]] == [(2, 2, 1)]
    finally:
        cluster.api.delete("packratmodels", name)
