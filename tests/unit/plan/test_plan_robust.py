"""The planner out of sample (issue 27): utilisation cap, backlogged capacity, the batch
guard, per-core plans, held-out resamples, the tail warning and infeasible answers that say
why; checked against the DES, brute force and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.des import simulate
from packrat.plan.provision import (
    Config,
    Planner,
    ProvisionError,
    Robustness,
    SimSettings,
    backlogged_capacity,
    exhaustive,
    provision,
    sustained_rate,
    tail_warning,
)
from packrat.plan.simulation import simulate_config
from packrat.plan.traces import block_resample, gamma_trace

Table = dict[tuple[int, int], float]


@st.composite
def plans(draw: st.DrawFn) -> tuple[Table, list[tuple[int, int]]]:
    """A small profile and 1-3 instances of it."""
    table: Table = {}
    for t in (1, 2):
        lat = draw(st.floats(2.0, 20.0))
        for b in (1, 2, 4):
            lat *= draw(st.floats(1.0, 2.0)) if b > 1 else 1.0
            table[(t, b)] = lat
    pairs = sorted(table)
    instances = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=3))
    return table, instances


@settings(max_examples=10, deadline=None)
@given(plans())
def test_backlogged_capacity_is_the_des_throughput_under_a_backlog(
    case: tuple[Table, list[tuple[int, int]]],
) -> None:
    """A burst far beyond capacity, all at t = 0: the DES serves it at sum b / L(t, b)."""
    table, instances = case
    n = 50 * sum(b for _, b in instances)
    result = simulate(
        np.zeros(n), table, instances, max_batch_delay_ms=5.0, queue_limit=n, spread="round_robin"
    )
    assert result.shed == 0
    last_ms = float(result.latencies_ms.max())
    capacity = backlogged_capacity(table, instances)
    assert n / (last_ms / 1000.0) <= capacity * 1.0001
    # the drain's end: beyond the fluid bound, at most a batching delay and what the slowest
    # instance still holds (up to its cap, two batches, routed to it before the end)
    slowest = max(table[p] for p in instances)
    assert last_ms <= n / capacity * 1000.0 + 5.0 + 2 * slowest + 1e-6


def test_capacity_is_not_the_best_fill() -> None:
    """Interpolation can make a partial batch the most efficient; a backlog never runs one."""
    table = {(1, 1): 10.0, (1, 4): 60.0}
    assert backlogged_capacity(table, [(1, 4)]) == pytest.approx(4 / 60 * 1000)
    assert backlogged_capacity(table, [(1, 4)]) < 100.0  # batch 1 alone: 100/s


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 30.0), min_size=1, max_size=200),
    st.floats(0.5, 8.0),
    st.integers(0, 1000),
    st.one_of(st.none(), st.floats(1.0, 90.0)),
)
def test_block_resample_keeps_blocks_and_order(
    raw: list[float], block: float, seed: int, length: float | None
) -> None:
    times = np.sort(np.array(raw))
    out = block_resample(times, block_s=block, seed=seed, length_s=length)
    assert np.all(np.diff(out) >= 0) and (out.size == 0 or out[0] >= 0)
    t = times - times[0]
    blocks = int(t[-1] // block)
    if blocks < 1:
        assert np.array_equal(out, t)
        return
    # every arrival is one of the trace's, shifted by whole blocks: the same offset in a block
    drawn = blocks if length is None else max(1, math.ceil(length / block))
    assert np.all(out < drawn * block + 1e-9)
    gap = np.abs(np.mod(out, block)[:, None] - np.mod(t, block)[None, :])
    assert np.all(np.min(np.minimum(gap, block - gap), axis=1) < 1e-6)


def test_sustained_rate_is_the_busiest_window() -> None:
    step = np.concatenate([np.arange(0, 300, 0.01), 300 + np.arange(0, 300, 0.0025)])
    assert sustained_rate(step) == pytest.approx(400.0, rel=0.01)  # 100/s then 400/s
    short = np.arange(0, 10, 0.01)
    assert sustained_rate(short) == pytest.approx(100.0, rel=0.02)


def small_planner(seed: int, **robust: object) -> Planner:
    rng = np.random.default_rng(seed)
    table: Table = {}
    w, serial = rng.uniform(5.0, 20.0), rng.uniform(0.05, 0.5)
    for t in range(1, 5):
        for b in (1, 2, 4, 8):
            table[(t, b)] = b ** rng.uniform(0.6, 1.0) * w * (serial + (1 - serial) / t)
    rate = float(rng.uniform(0.5, 2.0) * 1000.0 / table[(1, 1)])
    trace = gamma_trace(rate, cv=float(rng.choice([1.0, 3.0])), duration_s=1500 / rate, seed=seed)
    slo = table[(4, 1)] + rng.uniform(40.0, 150.0)
    return Planner(
        table,
        trace,
        slo_ms=slo,
        max_cores=16,
        sim=SimSettings(spread="round_robin"),
        robust=Robustness(**robust),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("seed", [0, 3])
def test_answer_within_the_cap_and_no_equal_cost_batch_step_that_worsens_p99(seed: int) -> None:
    planner = small_planner(seed, max_utilization=0.8)
    best, _ = planner.greedy()
    for ev in planner.searched():
        if ev.feasible:
            assert ev.utilization <= 0.8 + 1e-9 and ev.p99_ms <= planner.slo_ms
    if best.feasible:
        assert best.utilization <= 0.8 + 1e-9
        optimum = exhaustive(planner)
        assert optimum is not None and best.config.cores <= 2 * optimum.config.cores
    for before, after in zip(planner.path, planner.path[1:], strict=False):
        assert after.config.cores < before.config.cores or (
            after.config.cores == before.config.cores and after.p99_ms < before.p99_ms
        )


def test_a_batch_whose_full_latency_misses_the_slo_is_still_searched() -> None:
    """With a batching delay a batch rarely fills: batch 8's full latency (45 ms) exceeds the
    SLO (30 ms), yet at this rate its P99 meets it; the search must not skip it."""
    table = {(1, 1): 10.0, (1, 2): 12.0, (1, 4): 15.0, (1, 8): 45.0}
    trace = gamma_trace(150.0, cv=1.0, duration_s=20.0, seed=3)
    planner = Planner(table, trace, slo_ms=30.0, max_cores=6)
    ev = planner.fewest_replicas(1, 8)
    assert ev is not None and ev.feasible and table[(1, 8)] > planner.slo_ms
    optimum = exhaustive(planner)
    best, _ = planner.greedy()
    assert optimum is not None and best.config.cores == optimum.config.cores


def test_per_core_plans_are_searched_and_run_single_thread_instances() -> None:
    planner = small_planner(1)
    assert planner.shapes == ("packrat", "per_core")
    config = Config(4, 8, 1, "per_core")
    plan = planner.plan(config)
    assert plan.batch == 8 and all(g.threads == 1 for g in plan.instances)
    assert planner.config_instances(config) == tuple(plan.expand())
    assert small_planner(1, per_core=False).shapes == ("packrat",)
    # the per-core plan serves more per core (thin instances), at a slower full batch
    packrat = planner.instances(4, 8)
    assert planner.capacity(planner.config_instances(config)) >= planner.capacity(packrat) * 0.999


def test_validation_adds_replicas_until_every_resample_meets_the_slo() -> None:
    """M/D/1 near saturation on a short sample: the sample's P99 meets the SLO at the fewest
    replicas, ten-minute resamples of it need more."""
    table = {(1, 1): 10.0}
    trace = gamma_trace(170.0, cv=1.0, duration_s=20.0, seed=4)
    result = provision(
        Planner(table, trace, slo_ms=60.0, max_cores=8, robust=Robustness(resamples=3))
    )
    assert result.feasible and result.validation is not None
    assert result.validation.passed and max(result.validation.p99_ms) <= 60.0
    assert len(result.validation.p99_ms) == 3
    doc = result.to_dict()
    assert doc["utilization"] <= 0.9 and doc["validation"]["resamples"] == 3


def test_tail_warning_says_how_long_a_trace_is_enough() -> None:
    short = gamma_trace(20.0, duration_s=60.0, seed=1)
    warning = tail_warning(short)
    assert warning is not None and "5000 arrivals" in warning and f"{short.size}" in warning
    assert tail_warning(gamma_trace(100.0, duration_s=60.0, seed=1)) is None
    result = provision(Planner({(1, 1): 10.0}, short, slo_ms=100.0, max_cores=4))
    assert result.warnings and result.to_dict()["warnings"] == result.warnings


def test_infeasible_below_the_latency_floor_names_the_tightest_slo() -> None:
    table = {(1, 1): 50.0, (2, 1): 30.0}
    trace = gamma_trace(10.0, duration_s=30.0, seed=2)
    result = provision(Planner(table, trace, slo_ms=20.0))
    assert not result.feasible and result.infeasible is not None
    why = result.infeasible
    assert "a query alone takes at least 30.0 ms" in why.reason
    assert why.tightest_slo_ms is not None and why.tightest_slo_ms >= 30.0
    assert provision(Planner(table, trace, slo_ms=why.tightest_slo_ms)).feasible
    # served meanwhile: the cheapest configuration near the tightest SLO, not all 64 x T cores
    assert result.best.config.cores < 64 * 2
    assert result.best.p99_ms <= 1.25 * why.tightest_slo_ms
    assert result.to_dict()["infeasible"]["tightest_slo_ms"] == why.tightest_slo_ms


def test_infeasible_within_the_budget_names_the_cores_needed() -> None:
    table = {(1, 1): 10.0, (2, 1): 6.0}
    trace = gamma_trace(300.0, duration_s=2.0, seed=3)
    result = provision(Planner(table, trace, slo_ms=100.0, max_cores=2))
    assert not result.feasible and result.infeasible is not None
    needed = result.infeasible.cores_needed
    assert needed is not None and needed > 2 and "the budget is 2" in result.infeasible.reason
    assert provision(Planner(table, trace, slo_ms=100.0, max_cores=needed)).feasible


def test_robustness_is_checked() -> None:
    trace = np.array([0.0, 1.0])
    for bad in (Robustness(max_utilization=0.0), Robustness(resamples=-1)):
        with pytest.raises(ProvisionError):
            Planner({(1, 1): 1.0}, trace, slo_ms=10.0, robust=bad)


@settings(max_examples=15, deadline=None)
@given(st.floats(5.0, 60.0), st.floats(2.0, 20.0))
def test_simulated_utilization_is_the_offered_load(rate: float, latency: float) -> None:
    """One instance at batch 1 (M/D/1): utilisation is rate x D; P50 <= P99 <= P99.9."""
    if rate * latency / 1000.0 >= 0.95:
        return
    trace = gamma_trace(rate, duration_s=200.0, seed=1)
    s = simulate_config({(1, 1): latency}, trace, [(1, 1)], replicas=1, slo_ms=1e6)
    assert s.utilization == pytest.approx(s.sustained_rate * latency / 1000.0)
    assert s.p50_ms <= s.p99_ms <= s.p999_ms <= s.max_ms and s.shed_rate == 0.0
    assert s.meets_slo and s.p50_ms >= latency - 1e-9
