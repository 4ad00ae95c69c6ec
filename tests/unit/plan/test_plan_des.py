"""The serving DES against closed forms, an independent recursion, and its own invariants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging_support import ROOT

from packrat.plan.des import (
    SimulationError,
    batch_latency_table,
    nearest_rank,
    simulate,
)
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile
from packrat.plan.traces import gamma_trace
from packrat.serve.dispatcher.routing import choose_instance

PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"

arrival_lists = st.lists(st.floats(0, 2.0, allow_nan=False), min_size=1, max_size=120).map(
    lambda xs: np.sort(np.array(xs))
)


def lindley(arrivals_ms: np.ndarray, service_ms: float) -> np.ndarray:
    """Sojourn times of a FIFO single server with deterministic service (Lindley)."""
    out = np.empty_like(arrivals_ms)
    free = -math.inf
    for i, a in enumerate(arrivals_ms):
        begin = max(a, free)
        free = begin + service_ms
        out[i] = free - a
    return out


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.85])
def test_md1_mean_wait_matches_the_closed_form(rho: float) -> None:
    """M/D/1: W = rho * D / (2 (1 - rho)) (Pollaczek-Khinchine with zero service variance)."""
    service = 50.0
    rate = rho / (service / 1000.0)
    trace = gamma_trace(rate, cv=1.0, duration_s=60_000 / rate, seed=11)
    result = simulate(trace, {(1, 1): service}, [(1, 1)], max_batch_delay_ms=0.0, queue_limit=10**9)
    wait = result.mean_ms - service
    assert wait == pytest.approx(rho * service / (2 * (1 - rho)), rel=0.08)


@pytest.mark.parametrize(("rho", "cv"), [(0.3, 1.0), (0.6, 1.0), (0.6, 0.5), (0.85, 0.5)])
def test_mg1_mean_wait_matches_pollaczek_khinchine(rho: float, cv: float) -> None:
    """M/G/1 with gamma service times: W = rho * D * (1 + cv^2) / (2 (1 - rho)); cv 1 is
    M/M/1's rho * D / (1 - rho)."""
    service = 50.0
    rate = rho / (service / 1000.0)
    trace = gamma_trace(rate, cv=1.0, duration_s=100_000 / rate, seed=12)
    result = simulate(
        trace,
        {(1, 1): service},
        [(1, 1)],
        max_batch_delay_ms=0.0,
        queue_limit=10**9,
        service_cv=cv,
    )
    wait = result.mean_ms - service
    assert wait == pytest.approx(rho * service * (1 + cv * cv) / (2 * (1 - rho)), rel=0.1)


@settings(max_examples=50, deadline=None)
@given(arrival_lists, st.floats(0.1, 500.0), st.floats(0.2, 5.0))
def test_constant_service_factors_scale_the_profile(
    arrivals: np.ndarray, service: float, factor: float
) -> None:
    """Resampling one measured ratio is the profile scaled by it, exactly as Lindley says."""
    result = simulate(arrivals, {(1, 1): service}, [(1, 1)], service_factors=[factor] * 3)
    assert np.allclose(result.latencies_ms, lindley(arrivals * 1000.0, service * factor))


def test_service_spread_is_seeded_and_leaves_the_mean() -> None:
    trace = gamma_trace(10.0, duration_s=200.0, seed=3)
    plain = simulate(trace, {(1, 1): 20.0}, [(1, 1)])
    assert np.array_equal(
        plain.latencies_ms, simulate(trace, {(1, 1): 20.0}, [(1, 1)], service_cv=0.0).latencies_ms
    )
    spread = [simulate(trace, {(1, 1): 20.0}, [(1, 1)], service_cv=0.5, seed=s) for s in (1, 1, 2)]
    assert np.array_equal(spread[0].latencies_ms, spread[1].latencies_ms)
    assert not np.array_equal(spread[0].latencies_ms, spread[2].latencies_ms)
    # same mean service time, more variance: the tail grows
    assert spread[0].p99_ms > plain.p99_ms


@pytest.mark.parametrize(
    "kwargs",
    [
        {"service_cv": -0.1},
        {"service_cv": math.inf},
        {"service_factors": []},
        {"service_factors": [1.0, 0.0]},
    ],
)
def test_rejects_a_bad_service_spread(kwargs: dict[str, object]) -> None:
    with pytest.raises(SimulationError, match="service"):
        simulate([0.0], {(1, 1): 1.0}, [(1, 1)], **kwargs)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(arrival_lists, st.floats(0.1, 500.0))
def test_batch_one_equals_the_lindley_recursion(arrivals: np.ndarray, service: float) -> None:
    result = simulate(arrivals, {(1, 1): service}, [(1, 1)], queue_limit=10**9)
    assert np.allclose(result.latencies_ms, lindley(arrivals * 1000.0, service))


@settings(max_examples=100, deadline=None)
@given(arrival_lists, st.integers(1, 4), st.integers(1, 3))
def test_doubling_round_robin_replicas_never_slows_a_query(
    arrivals: np.ndarray, replicas: int, factor: int
) -> None:
    """Batch 1: replica r of m = k*n replicas sees a subsequence of what replica r mod n saw,
    and a FIFO server never gets slower with fewer arrivals."""
    kw = {"spread": "round_robin", "queue_limit": 10**9}
    few = simulate(arrivals, {(1, 1): 20.0}, [(1, 1)], replicas=replicas, **kw)
    many = simulate(arrivals, {(1, 1): 20.0}, [(1, 1)], replicas=replicas * factor, **kw)
    assert np.all(many.latencies_ms <= few.latencies_ms + 1e-9)
    assert many.p99_ms <= few.p99_ms + 1e-9


TABLE = {(1, 1): 10.0, (1, 2): 16.0, (1, 4): 30.0, (2, 1): 6.0, (2, 2): 9.0, (2, 4): 15.0}


@settings(max_examples=100, deadline=None)
@given(
    arrival_lists,
    st.lists(st.sampled_from(sorted(TABLE)), min_size=1, max_size=3),
    st.integers(1, 3),
    st.floats(0.0, 10.0),
)
def test_round_robin_replicas_are_independent_pods(
    arrivals: np.ndarray, instances: list[tuple[int, int]], replicas: int, delay: float
) -> None:
    """n round-robin replicas = each replica simulated alone on its share of the trace."""
    kw = {"max_batch_delay_ms": delay, "queue_limit": 10**9}
    joint = simulate(arrivals, TABLE, instances, replicas=replicas, spread="round_robin", **kw)
    for r in range(replicas):
        alone = simulate(arrivals[r::replicas], TABLE, instances, **kw)
        assert np.allclose(joint.latencies_ms[r::replicas], alone.latencies_ms)


@settings(max_examples=100, deadline=None)
@given(
    arrival_lists,
    st.lists(st.sampled_from(sorted(TABLE)), min_size=1, max_size=3),
    st.floats(0.0, 10.0),
    st.sampled_from(["random", "round_robin"]),
)
def test_every_query_is_answered_no_faster_than_one_batch(
    arrivals: np.ndarray, instances: list[tuple[int, int]], delay: float, spread: str
) -> None:
    result = simulate(
        arrivals,
        TABLE,
        instances,
        replicas=2,
        spread=spread,
        max_batch_delay_ms=delay,
        queue_limit=10**9,
    )
    fastest = min(TABLE[(t, 1)] for t, _ in instances)
    slowest_wait = len(arrivals) * max(TABLE.values()) + delay * len(arrivals)
    assert result.queries == len(arrivals) and result.shed == 0
    assert np.all(result.latencies_ms >= fastest - 1e-9)
    assert np.all(result.latencies_ms <= slowest_wait + max(TABLE.values()) + 1e-6)


def test_a_burst_of_b_finishes_at_the_plans_latency() -> None:
    """B simultaneous arrivals fill every instance with exactly its b_j (the routing rule),
    so the burst is done after the Packrat plan's expected latency."""
    profile = load_profile(PROFILE)
    opt = Optimizer.for_profile(profile, cpus=16, max_batch=64)
    for batch in (8, 24, 64):
        plan = opt.plan(batch)
        result = simulate(np.zeros(batch), profile.table(), plan.expand())
        assert result.latencies_ms.max() == pytest.approx(plan.expected_latency_ms)


def test_routing_matches_the_dispatchers_rule() -> None:
    """The DES's inlined routing sends a burst where serve.routing would."""
    instances = [(1, 1), (2, 4), (1, 2), (2, 4)]
    batches = [b for _, b in instances]
    outstanding = [0] * len(instances)
    for _ in range(sum(batches)):
        i = choose_instance(outstanding, batches)
        assert i is not None
        outstanding[i] += 1
    assert outstanding == batches
    result = simulate(np.zeros(sum(batches)), TABLE, instances)
    assert result.latencies_ms.max() == pytest.approx(max(TABLE[p] for p in instances))


def test_partial_batch_waits_for_the_delay() -> None:
    result = simulate(np.array([0.0]), {(1, 4): 30.0, (1, 1): 10.0}, [(1, 4)], max_batch_delay_ms=5)
    assert result.latencies_ms.tolist() == [15.0]


def test_full_queue_sheds_requests_as_misses() -> None:
    result = simulate(np.zeros(10), {(1, 1): 10.0}, [(1, 1)], queue_limit=3)
    # cap 2 at the instance, 3 waiting in the dispatcher, 5 shed
    assert result.shed == 5
    assert math.isinf(result.p99_ms)
    assert result.miss_rate(1000.0) == 0.5


def test_more_replicas_lower_p99_on_a_real_profile() -> None:
    profile = load_profile(PROFILE)
    plan = Optimizer.for_profile(profile, cpus=4, max_batch=8).plan(4)
    trace = gamma_trace(60.0, cv=2.0, duration_s=60.0, seed=5)
    p99s = [simulate(trace, profile.table(), plan.expand(), replicas=n).p99_ms for n in range(1, 7)]
    assert all(a >= b for a, b in itertools.pairwise(p99s)), p99s


def test_interpolates_unprofiled_partial_batches() -> None:
    lat = batch_latency_table({(1, 1): 10.0, (1, 4): 40.0, (2, 4): 1.0}, 1, 4)
    assert lat[1:] == [10.0, 20.0, 30.0, 40.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instances": [(3, 1)]}, "not in the profile"),
        ({"instances": []}, "at least one instance"),
        ({"replicas": 0}, "replicas must be"),
        ({"spread": "ipvs"}, "spread must be"),
        ({"arrivals_s": [1.0, 0.0]}, "sorted"),
    ],
)
def test_rejects_bad_configurations(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"arrivals_s": [0.0], "table": TABLE, "instances": [(1, 1)]}
    args.update(kwargs)
    with pytest.raises(SimulationError, match=message):
        simulate(**args)  # type: ignore[arg-type]


def test_nearest_rank() -> None:
    values = np.arange(1, 101, dtype=float)
    assert nearest_rank(values, 99) == 99.0
    assert nearest_rank(values, 100) == 100.0
    assert math.isnan(nearest_rank(np.array([]), 99))


def test_a_constant_schedule_equals_fixed_replicas() -> None:
    trace = gamma_trace(100.0, cv=2.0, duration_s=20.0, seed=4)
    for spread in ("random", "round_robin"):
        fixed = simulate(trace, TABLE, [(2, 4)], replicas=3, spread=spread)
        scheduled = simulate(trace, TABLE, [(2, 4)], spread=spread, schedule=[(0.0, 3)])
        assert np.array_equal(fixed.latencies_ms, scheduled.latencies_ms)


def test_scaling_up_mid_trace_cuts_the_backlog() -> None:
    trace = gamma_trace(400.0, duration_s=20.0, seed=4)  # one replica sustains ~267/s
    one = simulate(trace, TABLE, [(2, 4)], replicas=1, queue_limit=10**9)
    later = simulate(trace, TABLE, [(2, 4)], schedule=[(0.0, 1), (10.0, 3)], queue_limit=10**9)
    tail = trace > 15.0
    assert later.latencies_ms[tail].mean() < one.latencies_ms[tail].mean() / 10
    with pytest.raises(SimulationError, match="schedule"):
        simulate(trace, TABLE, [(2, 4)], schedule=[(1.0, 1)])
