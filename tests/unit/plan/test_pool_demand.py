"""A pooled model's demand (plan/pool/demand.py): the rate from two readings of a pool
pod's request counter, read as hostile input (counters going backwards, another pod, time
going backwards, absurd values), the service time from the plan, and the previous placement
kept while it is feasible and close to the best."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from packrat.plan.pool.demand import (
    MAX_RATE,
    MIN_INTERVAL_S,
    RateReading,
    next_rate,
    service_seconds,
    sticky,
)
from packrat.plan.pool.placement import ModelDemand, PodCapacity, place

MIB = 1 << 20


def test_no_rate_before_two_readings_then_delta_over_elapsed() -> None:
    first = next_rate(None, pod="p-0", requests=40, at=100.0)
    assert first == RateReading("p-0", 40, 100.0, 0.0)
    second = next_rate(first, pod="p-0", requests=140, at=110.0)
    assert second == RateReading("p-0", 140, 110.0, 10.0)


def test_readings_too_close_keep_the_baseline_and_its_rate() -> None:
    base = RateReading("p-0", 100, 50.0, 3.0)
    assert next_rate(base, pod="p-0", requests=999, at=50.0 + MIN_INTERVAL_S / 2) == base


def test_hostile_readings_start_a_new_baseline_or_are_ignored() -> None:
    base = RateReading("p-0", 100, 50.0, 3.0)
    # the counter went backwards (a restarted pod, or a lie): a new baseline, no rate
    assert next_rate(base, pod="p-0", requests=10, at=70.0) == RateReading("p-0", 10, 70.0)
    # another pod (the model moved): its counter is not this one's
    assert next_rate(base, pod="p-1", requests=500, at=70.0) == RateReading("p-1", 500, 70.0)
    # time went backwards
    assert next_rate(base, pod="p-0", requests=200, at=10.0) == RateReading("p-0", 200, 10.0)
    # unusable readings leave the baseline as it was
    for requests in (-1, True, 1 << 62, 2.5):
        assert next_rate(base, pod="p-0", requests=requests, at=70.0) == base  # type: ignore[arg-type]
    assert next_rate(base, pod="p-0", requests=200, at=math.nan) == base
    assert next_rate(None, pod="p-0", requests=-5, at=70.0) is None
    # an absurd jump is capped
    huge = next_rate(base, pod="p-0", requests=(1 << 61), at=60.0)
    assert huge is not None and huge.rate == MAX_RATE
    # a corrupt baseline (a status edited by hand) is replaced, not trusted
    bad = RateReading("p-0", -3, 50.0, -1.0)
    assert next_rate(bad, pod="p-0", requests=7, at=70.0) == RateReading("p-0", 7, 70.0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["p-0", "p-1"]),
            st.integers(min_value=-10, max_value=1 << 63),
            st.floats(allow_nan=True, allow_infinity=True, width=64),
        ),
        max_size=30,
    )
)
def test_rate_always_finite_and_bounded(readings: list[tuple[str, int, float]]) -> None:
    base: RateReading | None = None
    for pod, requests, at in readings:
        base = next_rate(base, pod=pod, requests=requests, at=at)
        if base is not None:
            assert 0 <= base.rate <= MAX_RATE and math.isfinite(base.rate)
            assert 0 <= base.requests < 1 << 62 and math.isfinite(base.at)


def test_service_time_is_threads_times_batch1_latency() -> None:
    assert service_seconds(4, 25.0) == 0.1
    assert service_seconds(2, None) == 0.0  # not profiled yet: no demand
    assert service_seconds(2, math.inf) == 0.0


def _models(rates: dict[str, float]) -> list[ModelDemand]:
    return [ModelDemand(n, weight_bytes=MIB, rate=r, service_s=0.1) for n, r in rates.items()]


def test_previous_placement_kept_while_feasible_and_close_to_the_best() -> None:
    pods = [PodCapacity("p-0", 64 * MIB, 2.0), PodCapacity("p-1", 64 * MIB, 2.0)]
    models = _models({"a": 5.0, "b": 4.0})  # 0.5 and 0.4 cores
    best = place(models, pods)
    assert set(best.assignment.values()) == {"p-0", "p-1"}
    together = {"a": "p-0", "b": "p-0"}  # 0.9 of 2 cores: load 0.45 vs the best's 0.25
    assert sticky(best, together, models, pods).assignment == best.assignment
    assert sticky(best, together, models, pods, slack=2.0).assignment == together
    swapped = {"a": best.assignment["b"], "b": best.assignment["a"]}  # as good: kept
    kept = sticky(best, swapped, models, pods)
    assert kept.assignment == swapped and kept.moves == 0
    # infeasible now (more demand than the pod's usable cores): the best
    hot = _models({"a": 10.0, "b": 9.0})
    assert sticky(place(hot, pods), together, hot, pods, slack=100.0).assignment != together
    # a pod gone, or a new model: the best
    assert sticky(best, {"a": "p-0", "b": "p-9"}, models, pods) == best
    assert sticky(best, {"a": "p-0"}, models, pods) == best
