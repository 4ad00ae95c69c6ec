"""autoBatch end to end: the real operator follows a load step with exactly one automatic switch
and no failed request.

The operator (kopf subprocess) runs against the kmock emulator; the test agent runs real
``packrat profile`` and ``packrat serve`` processes (tiny model) and publishes the serving pods,
so the operator reads every ready pod's ``/status`` estimate. Closed-loop load goes through the
Service proxy: one client (the load forms batches of 1, the plan's batch), then bursts of 64
concurrent requests from ``packrat loadgen`` subprocesses (the pods' estimates land at 16 or
more, above the range's maximum, 8, so the operator clamps to 8 before and after the switch).

Deterministic by design: the step is eight times the range's maximum and sustain (3 readings)
filters the ramp, so the operator switches once to a larger batch and then holds (the load
keeps forming that batch). The test is not about profiling: the model gets the session's
measured profile (``tiny_profiles``, every point of the grid measured) as its profile ConfigMap
right after the operator keys it. A profile measured by the model's own Job under a time budget
came out with 3 of 8 points on a loaded machine, and batch 8 was then infeasible. No timing
assertions; every wait polls a condition (decisions counted in the operator's metrics, not
seconds slept) with a deadline sized for a loaded 2-core machine.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from harness import BurstLoad, Load, OperatorCluster, wait_for
from models import body, tiny_spec, wait_ready
from promtext import sample, values
from seeding import MeasuredProfiles, seed_profile

from packrat.plan.profile import Profile

# the session's profile may be measured here first (minutes on a loaded machine)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

NAME = "auto"
# the default ready timeout: a new slot's TorchServe took over 90 s to start on a loaded
# machine, and an aborted switch is a second entry in switchHistory
SPEC: dict[str, Any] = tiny_spec(
    8, autoBatch={"min": 1, "max": 8, "sustainObservations": 3, "minIntervalSeconds": 0}
)


SLOW = 180.0  # a deadline for anything that takes seconds on a quiet machine


def _growing(profile: Profile) -> Profile:
    """The measured profile with each width's latency growing with the batch (at least 10% a
    doubling). The tiny model's latency is nearly flat in the batch (per-call overhead), so on a
    noisy machine a larger batch's plan can measure as fast as batch 1's; the operator then
    serves batch 1 on that plan (monotone plans, issue 37), it already holds the step's batch and
    there is rightly no switch to make. A real model's latency grows with its batch."""
    points, last = [], {}
    for point in sorted(profile.points, key=lambda q: (q.threads, q.batch)):
        floor = last.get(point.threads, 0.0) * 1.1
        grown = replace(point, latency_ms=max(point.latency_ms, floor))
        last[point.threads] = grown.latency_ms
        points.append(grown)
    return profile.with_points(points)


def _decisions(cluster: OperatorCluster) -> float:
    return sample(cluster.operator.metrics(), "packrat_operator_autobatch_decisions_total")


def test_operator_follows_a_load_step_with_one_switch_and_no_failures(
    cluster: OperatorCluster, tiny_profiles: MeasuredProfiles
) -> None:
    profile = _growing(tiny_profiles.profile(SPEC["profiling"]["maxBatch"]))  # measured
    cluster.api.create("packratmodels", body(NAME, SPEC))
    cm_name = seed_profile(cluster, NAME, profile)
    wait_ready(cluster, NAME)
    status = cluster.status(NAME)
    assert status["batchSize"]["current"] == 1 and status["plan"]["batch"] == 1  # autoBatch.min
    assert status["profile"]["configMap"] == cm_name  # planned from the seeded profile
    wait_for(lambda: not cluster.api.list("jobs"), timeout=SLOW, what="profiling job deleted")

    # the operator finds the serving pod itself (not only the Service) and reads its estimate
    low_start = time.monotonic()
    with Load(cluster, NAME, NAME, clients=1) as low:
        seen = wait_for(
            lambda: (
                (cluster.status(NAME).get("batchSize") or {}).get("lastDecision")
                and cluster.status(NAME)["batchSize"]
            ),
            timeout=SLOW,
            what="a first autoBatch decision",
            period=0.25,
        )
        low_decisions = _decisions(cluster)
        wait_for(  # several observations at the low load
            lambda: _decisions(cluster) >= low_decisions + 3,
            timeout=SLOW,
            what="three more decisions at the low load",
            period=0.25,
        )
    assert seen["source"] == "pods" and len(seen["estimates"]) == 1
    status = cluster.status(NAME)
    assert "switch" not in status and not status.get("switchHistory")
    assert status["batchSize"]["current"] == 1

    # the step: closed-loop bursts of 64 concurrent requests, eight times the range's maximum
    with BurstLoad(cluster, NAME, NAME, burst=64) as high:
        wait_for(  # sustain, then a rollout of the new slot within its ready timeout
            lambda: len(cluster.status(NAME).get("switchHistory") or []) >= 1,
            timeout=SLOW + SPEC["switch"]["readyTimeoutSeconds"],
            what="an automatic switch",
            period=0.25,
            detail=lambda: f"batchSize: {cluster.status(NAME).get('batchSize')}",
        )
        switched_at = time.monotonic()
        # keep the load on: it still forms the same batch, so the operator must hold there
        # through several decisions of its own
        switched_decisions = _decisions(cluster)
        wait_for(
            lambda: (
                _decisions(cluster) >= switched_decisions + 5
                and (cluster.status(NAME)["batchSize"].get("lastDecision") or {}).get("time")
                > cluster.status(NAME)["switchHistory"][-1]["time"]
            ),
            timeout=SLOW,
            what="decisions after the switch",
            period=0.25,
        )
    status = cluster.status(NAME)
    history = status["switchHistory"]
    assert len(history) == 1, history  # exactly one switch: no flapping
    (entry,) = history
    assert entry["result"] == "Succeeded"
    assert entry["fromBatch"] == 1 and entry["toBatch"] > 1, entry  # to a larger batch
    target = entry["toBatch"]
    assert status["batchSize"]["current"] == target and status["plan"]["batch"] == target
    assert "target" not in status["batchSize"] and "switch" not in status
    # after the switch the operator kept deciding, and held (no second switch)
    assert status["batchSize"]["lastDecision"]["outcome"].startswith("hold_")
    print("switch:", entry, "\nbatchSize:", status["batchSize"])
    assert status["activeSlot"] == "b"

    # zero failed requests across both phases and the switch
    assert low.results and high.records and not high.errors, high.errors[-1:]
    assert low.failures == [] and high.failures == [], (low.failures + high.failures)[:5]
    assert sum(1 for t, _, _ in high.records if t > switched_at) > 0  # served by the new plan
    assert min(t for t, _ in low.results) >= low_start

    # the events and metrics tell the same story
    changed = cluster.events("BatchSizeChanged")
    assert len(changed) == 1 and f"batch 1 -> {target}" in changed[0]["message"]
    text = cluster.operator.metrics()
    decisions = "packrat_operator_autobatch_decisions_total"
    assert sample(text, decisions, outcome="switch") == 1
    holds = sum(
        sample(text, decisions, outcome=o)
        for o in ("hold_same", "hold_not_sustained", "hold_gain_too_small", "hold_too_soon")
    )
    assert holds > 0
    assert sample(text, "packrat_operator_switch_duration_seconds_count") == 1
    # (label subsets: kmock leaves metadata.namespace unset on watch events, so the namespace
    # label may be "", and series may gain labels)
    observed = values(text, "packrat_model_observed_batch_size", model=NAME)
    # the gauge is the last observation, the one in status (the load has stopped, so the pods'
    # estimates, and therefore the observations, no longer move)
    assert observed == [float(cluster.status(NAME)["batchSize"]["observed"])], observed
