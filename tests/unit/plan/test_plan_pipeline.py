"""The DAG DES: hand-computed cases, the single-model DES as a special case, properties."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.des import simulate
from packrat.plan.pipeline.simulate import (
    Edge,
    Pipeline,
    PipelineError,
    PipelineSim,
    Stage,
    StageRun,
    simulate_pipeline,
)
from packrat.plan.traces import gamma_trace

SMALL = {(1, 1): 10.0, (1, 2): 16.0, (1, 4): 28.0, (2, 1): 6.0, (2, 2): 10.0, (2, 4): 17.0}
BIG = {(1, 1): 40.0, (1, 2): 70.0, (2, 1): 22.0, (2, 2): 38.0}
ONE = StageRun(((1, 1),), 1)


def chain(*tables: dict[tuple[int, int], float], fractions: list[float] | None = None) -> Pipeline:
    names = [f"s{i}" for i in range(len(tables))]
    fr = fractions or [1.0] * (len(tables) - 1)
    return Pipeline(
        [Stage(n, t) for n, t in zip(names, tables, strict=True)],
        [Edge(a, b, f) for a, b, f in zip(names, names[1:], fr, strict=False)],
    )


def test_a_two_stage_chain_at_low_load_is_the_sum_of_its_stages() -> None:
    """Queries far apart never queue: each takes L_a(1) + L_b(1) at batch 1, and
    L_a(1) + delay + L_b(1) when the first stage waits out its batch delay."""
    p = chain(SMALL, BIG)
    trace = np.arange(20) * 1.0  # one query a second, stages take tens of ms
    r = simulate_pipeline(trace, p, {"s0": StageRun(((2, 1),), 1), "s1": ONE})
    assert np.allclose(r.latencies_ms, 6.0 + 40.0)
    r = simulate_pipeline(
        trace,
        p,
        {"s0": StageRun(((1, 2),), 3), "s1": StageRun(((2, 2),), 2)},
        max_batch_delay_ms=5.0,
    )
    # each stage: a batch of one after the 5 ms delay, latency L(t, 1)
    assert np.allclose(r.latencies_ms, (5.0 + 10.0) + (5.0 + 22.0))


def test_a_join_waits_for_its_slowest_parent() -> None:
    """a -> b, a -> c, b -> d, c -> d: d starts when the slower branch is done."""
    p = Pipeline(
        [Stage("a", SMALL), Stage("b", SMALL), Stage("c", BIG), Stage("d", SMALL)],
        [Edge("a", "b"), Edge("a", "c"), Edge("b", "d"), Edge("c", "d")],
    )
    r = simulate_pipeline([0.0, 5.0], p, dict.fromkeys("abcd", ONE))
    assert np.allclose(r.latencies_ms, 10.0 + 40.0 + 10.0)
    assert np.allclose(r.stage_latencies("d"), 10.0)


def test_a_fraction_zero_cascade_edge_costs_nothing() -> None:
    """The cascade stage is never visited: end-to-end latencies equal the first stage's
    alone (the same pipeline without the cascade), query for query, whatever the cascade
    stage's configuration."""
    trace = gamma_trace(60.0, cv=3.0, duration_s=30.0, seed=3)
    first = StageRun(((1, 2), (1, 2)), 2)
    alone = PipelineSim(Pipeline([Stage("s0", SMALL)]), trace, seed=4).run({"s0": first})
    p = chain(SMALL, BIG, fractions=[0.0])
    for cascade in (ONE, StageRun(((2, 2),), 5)):
        sim = PipelineSim(p, trace, seed=4)
        r = sim.run({"s0": first, "s1": cascade})
        assert np.array_equal(r.latencies_ms, alone.latencies_ms)
        assert sim.scale_factor("s1") == 0.0 and r.stage_latencies("s1").size == 0
    # and the stage alone is the single-model DES on the same trace
    direct = simulate(trace, SMALL, [(1, 2), (1, 2)], replicas=2, seed=4 + zlib.crc32(b"s0"))
    assert np.allclose(alone.latencies_ms, direct.latencies_ms)


def test_a_single_stage_pipeline_is_the_single_model_des() -> None:
    trace = gamma_trace(120.0, cv=2.0, duration_s=20.0, seed=5)
    p = Pipeline([Stage("m", SMALL)])
    sim = PipelineSim(p, trace, seed=11, spread="round_robin", max_batch_delay_ms=3.0)
    got = sim.run({"m": StageRun(((1, 4), (1, 2)), 2)}).latencies_ms
    want = simulate(
        trace, SMALL, [(1, 4), (1, 2)], replicas=2, spread="round_robin", max_batch_delay_ms=3.0
    ).latencies_ms
    assert np.allclose(got, want)


def test_failures_propagate_downstream() -> None:
    """A query shed by the first stage (queue full) fails end to end, and is never served by
    the second stage; the others are."""
    p = chain(SMALL, SMALL)
    trace = np.zeros(10)  # ten at once into one instance with room for 2 + 3 queued
    r = simulate_pipeline(trace, p, {"s0": ONE, "s1": ONE}, queue_limit=3)
    failed = np.isinf(r.latencies_ms)
    assert failed.sum() == 5
    assert np.all(np.isinf(r.done_ms["s1"][failed]))
    assert np.all(np.isfinite(r.latencies_ms[~failed]))


@pytest.mark.parametrize(
    ("edges", "message"),
    [
        ([Edge("a", "x")], "unknown stage 'x'"),
        ([Edge("a", "b"), Edge("b", "a")], "cycle"),
        ([Edge("a", "b", 1.5)], "fraction must be in"),
        ([Edge("a", "a")], "cannot feed itself"),
        ([Edge("a", "b"), Edge("a", "b")], "declared twice"),
    ],
)
def test_malformed_pipelines_are_refused(edges: list[Edge], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        Pipeline([Stage("a", SMALL), Stage("b", SMALL)], edges)


traces = st.lists(
    st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=1, max_size=60
).map(lambda xs: np.sort(np.asarray(xs)))
fractions = st.sampled_from([0.0, 0.25, 0.5, 1.0])
runs = st.sampled_from(
    [StageRun(((1, 1),), 1), StageRun(((2, 2),), 1), StageRun(((1, 2), (1, 2)), 2)]
)


@settings(max_examples=60, deadline=None)
@given(trace=traces, f1=fractions, f2=fractions, r0=runs, r1=runs, r2=runs, seed=st.integers(0, 9))
def test_properties_of_a_cascade(
    trace: np.ndarray,
    f1: float,
    f2: float,
    r0: StageRun,
    r1: StageRun,
    r2: StageRun,
    seed: int,
) -> None:
    """s0 -> s1 (f1) -> s2 (f2): a query visits a prefix of the chain; it is never faster
    than the batch-1 latencies along what it visits; it is answered by its last stage; the
    result does not depend on the order the edges are declared in."""
    p = chain(SMALL, BIG, SMALL, fractions=[f1, f2])
    runs_ = {"s0": r0, "s1": r1, "s2": r2}
    sim = PipelineSim(p, trace, seed=seed, queue_limit=10_000)
    r = sim.run(runs_)
    v0, v1, v2 = (sim.visits[n] for n in ("s0", "s1", "s2"))
    assert v0.all() and not (v2 & ~v1).any()
    if f1 == 0.0:
        assert not v1.any()
    if f1 == 1.0 and f2 == 1.0:
        assert v2.all()
    fastest = {n: min(t[(tt, 1)] for tt in (1, 2)) for n, t in (("s0", SMALL), ("s1", BIG))}
    floor = fastest["s0"] + v1 * fastest["s1"] + v2 * fastest["s0"]
    assert np.all(r.latencies_ms >= floor - 1e-9)
    last = np.where(v2, r.done_ms["s2"], np.where(v1, r.done_ms["s1"], r.done_ms["s0"]))
    assert np.allclose(last - sim.arrivals_ms, r.latencies_ms)
    flipped = Pipeline([p.stages[n] for n in ("s2", "s1", "s0")], list(reversed(p.edges)))
    again = PipelineSim(flipped, trace, seed=seed, queue_limit=10_000).run(runs_)
    assert np.array_equal(again.latencies_ms, r.latencies_ms)


@settings(max_examples=40, deadline=None)
@given(trace=traces, k=st.integers(1, 3), seed=st.integers(0, 9))
def test_more_replicas_upstream_never_delay_the_kth_answer(
    trace: np.ndarray, k: int, seed: int
) -> None:
    """Batch 1, round-robin, one replica last: multiplying the first stage's replicas never
    makes the k-th answer of the pipeline later (FIFO with equal service is monotone)."""
    p = chain(SMALL, BIG)
    base = {"s0": StageRun(((1, 1),), 1), "s1": ONE}
    more = {"s0": StageRun(((1, 1),), k), "s1": ONE}
    a = PipelineSim(p, trace, seed=seed, spread="round_robin").run(base)
    b = PipelineSim(p, trace, seed=seed, spread="round_robin").run(more)
    ends_a = np.sort(a.latencies_ms + trace * 1000.0)
    ends_b = np.sort(b.latencies_ms + trace * 1000.0)
    assert np.all(ends_b <= ends_a + 1e-6)


def test_visit_fractions_follow_the_edges() -> None:
    """On 40,000 queries the cascade's visit fractions are the products of the edge
    fractions, within five standard deviations."""
    n = 40_000
    p = chain(SMALL, SMALL, SMALL, fractions=[0.6, 0.5])
    sim = PipelineSim(p, np.zeros(n), seed=1)
    for name, want in (("s0", 1.0), ("s1", 0.6), ("s2", 0.3)):
        sd = math.sqrt(want * (1 - want) / n)
        assert abs(sim.scale_factor(name) - want) <= 5 * sd + 1e-12


def test_hop_overhead_is_added_per_stage_visited_and_once_for_the_entry() -> None:
    """A chain a -> b at low load: (2 stages + the entry hop) x overhead on top of the
    stages; a cascade stage never taken adds no hop; two parallel roots add one hop each
    but run side by side (the path is entry + one stage)."""
    trace = np.arange(20) * 1.0
    p = chain(SMALL, BIG)
    runs = {"s0": StageRun(((2, 1),), 1), "s1": ONE}
    r = simulate_pipeline(trace, p, runs, overhead_ms=7.0)
    assert np.allclose(r.latencies_ms, 6.0 + 40.0 + 3 * 7.0)
    assert np.allclose(r.stage_latencies("s1"), 40.0 + 7.0)  # the stage's call includes its hop
    cascade = chain(SMALL, BIG, fractions=[0.0])
    r = simulate_pipeline(trace, cascade, runs, overhead_ms=7.0)
    assert np.allclose(r.latencies_ms, 6.0 + 2 * 7.0)
    side = Pipeline([Stage("s0", SMALL), Stage("s1", BIG)])
    r = simulate_pipeline(trace, side, runs, overhead_ms=7.0)
    assert np.allclose(r.latencies_ms, 40.0 + 2 * 7.0)
    assert simulate_pipeline(trace, p, runs).p99_ms == pytest.approx(46.0)  # default: none
