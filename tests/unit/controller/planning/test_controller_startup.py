"""Start-up time in the operator's tuner (issue 27 item 3): measured from the model's pods,
floored by ``startupFloorSeconds``, and the headroom it buys: a model whose sample shows a
4x step holds its planned replicas through a quiet phase instead of scaling down."""

from __future__ import annotations

import datetime
from typing import Any

from kube_support import (
    NS,
    T0,
    FakeKube,
    Feed,
    add_model,
    after,
    finish_switch,
    gamma_burst,
    to_ready,
    unbatched_spec,
)

from packrat.controller.planning.autoscale import Arrivals
from packrat.controller.planning.startup import measure, pod_startup
from packrat.controller.serving import manifests as m
from packrat.plan.traces import step_trace, trace_to_csv


def _pod(name: str, created: Any, ready: Any, *, status: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created, "labels": m.base_labels("tiny")},
        "status": {
            "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": ready}]
        },
    }


def test_startup_is_the_slowest_recent_pod_and_at_least_the_floor() -> None:
    pods = [
        _pod("a", "2026-01-01T00:00:00Z", "2026-01-01T00:00:12Z"),
        _pod("b", "2026-01-01T00:10:00Z", "2026-01-01T00:10:30Z"),
        _pod("c", "2026-01-01T00:20:00Z", "2026-01-01T00:20:08Z"),
        _pod("d", "2026-01-01T00:30:00Z", None, status="False"),  # not ready yet
    ]
    got = measure(pods, floor_s=0.0)
    assert got.measured == 30.0 and got.seconds == 30.0 and got.pods == 3
    assert measure(pods, floor_s=120.0).seconds == 120.0
    assert measure([], floor_s=5.0).measured is None and measure([], floor_s=5.0).seconds == 5.0
    assert got.to_status() == {
        "seconds": 30.0,
        "floorSeconds": 0.0,
        "measuredSeconds": 30.0,
        "pods": 3,
    }


def test_hostile_pod_fields_are_ignored() -> None:
    for created, ready in [
        ("not a time", "2026-01-01T00:00:12Z"),
        (12345, "2026-01-01T00:00:12Z"),
        ("2026-01-01T00:00:12Z", "2026-01-01T00:00:00Z"),  # ready before created
        ("2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z"),  # two days: implausible
        (None, None),
    ]:
        assert pod_startup(_pod("x", created, ready)) is None
    assert pod_startup({"metadata": "nonsense", "status": []}) is None


def _step_model(kube: FakeKube, floor: int) -> Any:
    """A model planned on a sample with a 4x step (1000 -> 4000/s)."""
    sample = step_trace([1000.0, 4000.0], phase_s=3.0, seed=3)
    cm = {"metadata": {"name": "trace", "namespace": NS}, "data": {"t.csv": trace_to_csv(sample)}}
    kube.create("configmaps", NS, cm)
    slo = {"latencyP99Ms": 20, "trace": {"configMap": "trace", "key": "t.csv"}, "maxCores": 12}
    auto = {"maxReplicas": 8, "scaleDownDelaySeconds": 10, "startupFloorSeconds": floor}
    rec = add_model(kube, unbatched_spec(slo=slo, autoscaling=auto))
    to_ready(kube, rec)
    return rec


def _quiet_replicas(kube: FakeKube, rec: Any) -> list[int]:
    """Ninety seconds at the sample's quiet rate: the replica counts decided."""
    t0, out = T0.timestamp(), []
    for second in range(5, 95, 5):
        quiet = Arrivals(times=gamma_burst(t0 + second - 5, 5, 1000), pods=1)
        rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=second), arrivals=quiet)
        out.append(kube.get("deployments", NS, "tiny-a")["spec"]["replicas"])
    return out


def test_a_startup_floor_keeps_headroom_for_the_step_the_sample_shows() -> None:
    plain_kube, aware_kube = FakeKube(), FakeKube()
    plain = _quiet_replicas(plain_kube, _step_model(plain_kube, floor=0))
    aware = _quiet_replicas(aware_kube, _step_model(aware_kube, floor=30))
    planned = aware_kube.prm()["status"]["provisioning"]["replicas"]
    assert planned > 1
    assert min(plain) < planned  # no start-up time: scaled down in the quiet phase
    assert min(aware) == planned  # 30 s to start a replica: the step's headroom is kept
    startup = aware_kube.prm()["status"]["autoscaling"]["startup"]
    assert startup["seconds"] == 30.0 and startup["floorSeconds"] == 30.0
    assert startup["growth"] > 2.0
    assert plain_kube.prm()["status"]["autoscaling"]["startup"]["growth"] == 1.0


# -- plan and replicas together (issue 27 item 4) ------------------------------------------
def test_with_an_slo_the_plan_follows_the_load_while_the_tuner_sets_replicas() -> None:
    """slo + autoBatch: the planner's batch is the start and the floor; sustained estimates
    of a smaller batch do not move the plan, those of a larger one switch it inside the
    replicas (same CPUs per replica); the tuner counts on no more per replica than the planned
    plan serves (a larger batch absorbs a surge, it does not replace replicas)."""

    kube, rec, feed = _slo_autobatch_ready(latency_ms=20, rate=2000)
    status = kube.prm()["status"]
    prov = status["provisioning"]
    assert (
        status["plan"]["batch"] == prov["batch"]
        and status["plan"]["cpus"] == prov["cpusPerReplica"]
    )
    planned_rates = (
        status["autoscaling"]["planned"]["ratesPerSecond"] if "autoscaling" in status else None
    )
    assert prov["batch"] < 8  # room above the planner's batch in autoBatch's range
    t0 = T0.timestamp()
    feed.next = [1, 1]  # at the planner's batch (1 here): nothing to do
    for second in (1, 2):
        steady = Arrivals(times=gamma_burst(t0 + second - 1, 1, 2000), pods=1)
        rec.reconcile(NS, "tiny", now=after(second), arrivals=steady)
    status = kube.prm()["status"]
    assert "target" not in status["batchSize"] and "switch" not in status
    assert status["plan"]["batch"] == prov["batch"]
    feed.next = [8, 8]
    for second in (3, 4):
        steady = Arrivals(times=gamma_burst(t0 + second - 1, 1, 2000), pods=1)
        rec.reconcile(NS, "tiny", now=after(second), arrivals=steady)
    assert kube.prm()["status"]["batchSize"]["target"] == 8
    rec.reconcile(NS, "tiny", now=after(5), arrivals=None)
    assert kube.prm()["status"]["switch"]["plan"]["batch"] == 8
    finish_switch(kube, rec, at=6)
    status = kube.prm()["status"]
    assert status["plan"]["batch"] == 8 and status["plan"]["cpus"] == prov["cpusPerReplica"]
    steady = Arrivals(times=gamma_burst(t0 + 14, 1, 2000), pods=1)
    rec.reconcile(NS, "tiny", now=after(15), arrivals=steady)
    rates = kube.prm()["status"]["autoscaling"]["planned"]["ratesPerSecond"]
    assert planned_rates is not None and rates == planned_rates  # the planned capacity kept


def test_with_an_slo_autobatch_never_goes_below_the_planners_batch() -> None:
    """The planner chose its batch for the SLO's capacity: autoBatch moves up from it, never
    down (clamped to autoBatch's range), whatever the status holds."""
    from packrat.controller.core.model import model_spec
    from packrat.controller.core.status import ModelStatus
    from packrat.controller.planning.batching import slo_batch, slo_floor

    slo = {"latencyP99Ms": 20, "rate": 2000, "durationSeconds": 4, "maxCores": 12}
    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}, "slo": slo}
    model = model_spec({**spec, "autoBatch": {"min": 2, "max": 8}})
    assert slo_floor(model, 4) == 4 and slo_floor(model, 1) == 2 and slo_floor(model, 16) == 8

    def st(**batch: int) -> ModelStatus:
        return ModelStatus({"batchSize": batch} if batch else {})

    assert slo_batch(model, st(), 4) == (4, 8)
    assert slo_batch(model, st(current=1), 4) == (4, 8)  # not below
    assert slo_batch(model, st(target=6, current=4), 4) == (6, 8)  # up
    assert slo_batch(model, st(current=64), 4) == (8, 8)
    fixed = model_spec(spec)
    assert slo_batch(fixed, st(current=2), 4) == (4, 4)  # no autoBatch


def _slo_autobatch_ready(*, latency_ms: float, rate: float) -> tuple[FakeKube, Any, Any]:
    """A Ready tiny model with an SLO, autoBatch (1..8, 2 observations 2 s apart) and the
    envelope tuner; its reconciler reads the estimates ``feed.next`` holds."""

    kube = FakeKube()
    slo = {"latencyP99Ms": latency_ms, "rate": rate, "durationSeconds": 4, "maxCores": 12}
    auto = {"min": 1, "max": 8, "sustainObservations": 2, "minIntervalSeconds": 2}
    spec = unbatched_spec(
        slo=slo, autoBatch=auto, autoscaling={"maxReplicas": 8, "intervalSeconds": 1}
    )
    feed = Feed()
    rec = add_model(kube, spec, estimates=feed)
    to_ready(kube, rec)
    return kube, rec, feed


def test_with_an_slo_a_pass_never_decides_below_the_planners_batch() -> None:
    """Sustained estimates of batch 1 under a plan the planner made for batch 4: autoBatch
    holds (the floor), where without an SLO it would follow them down."""

    kube, rec, feed = _slo_autobatch_ready(latency_ms=200, rate=5000)
    planned = kube.prm()["status"]["provisioning"]["batch"]
    assert planned > 1
    feed.next = [1, 1]
    t0 = T0.timestamp()
    for second in (1, 2, 3, 4):
        steady = Arrivals(times=gamma_burst(t0 + second - 1, 1, 5000), pods=1)
        rec.reconcile(NS, "tiny", now=after(second), arrivals=steady)
    status = kube.prm()["status"]
    assert status["batchSize"]["observed"] == planned  # the estimate, clamped to the floor
    assert "target" not in status["batchSize"] and "switch" not in status
    assert status["plan"]["batch"] == planned


def test_with_an_slo_a_pass_never_decides_above_the_slos_largest_batch() -> None:
    """A backlog reads as a large batch; one whose optimal plan alone takes longer than the
    SLO would miss it for every query it holds: on the 1-core replicas the planner chose,
    sustained estimates of batch 8 (7.0 ms a batch on the test profile; batch 4: 3.5 ms)
    under an SLO of 3 ms switch to batch 2 (1.8 ms), the top; a pass never plans above it."""

    kube, rec, feed = _slo_autobatch_ready(latency_ms=3, rate=200)
    prov = kube.prm()["status"]["provisioning"]
    assert prov["cpusPerReplica"] == 1 and prov["batch"] == 1
    feed.next = [8, 8]
    t0 = T0.timestamp()
    for second in (1, 2):
        steady = Arrivals(times=gamma_burst(t0 + second - 1, 1, 200), pods=1)
        rec.reconcile(NS, "tiny", now=after(second), arrivals=steady)
    seen = kube.prm()["status"]["batchSize"]
    assert seen["observed"] == 2 and seen["target"] == 2  # clamped to the SLO's top
    # a target above the top (chosen before the SLO was made tighter) is planned at the top
    kube.objects[("packratmodels", NS, "tiny")]["status"]["batchSize"]["target"] = 8
    rec.reconcile(NS, "tiny", now=after(3), arrivals=None)
    assert kube.prm()["status"]["switch"]["plan"]["batch"] == 2
