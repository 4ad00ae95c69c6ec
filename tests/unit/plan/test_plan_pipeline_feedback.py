"""Measured scale factors fed back (issue 27 item 5): validated, after enough samples,
smoothed, with hysteresis; the scale factors and the ingress rule against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.pipeline.feedback import (
    EdgeEstimate,
    FeedbackPolicy,
    fractions_used,
    scale_factors,
    stage_demand,
    thin,
    thin_phase,
    update_edge,
)

POLICY = FeedbackPolicy(min_samples=200, half_life=1000, min_change=0.05, step=0.01)


def run(rounds: list[tuple[float, float]]) -> EdgeEstimate | None:
    est = None
    for taken, answered in rounds:
        est = update_edge(est, taken=taken, answered=answered, policy=POLICY)
    return est


def test_nothing_replaces_the_declared_fraction_before_enough_samples() -> None:
    est = run([(30, 100)])
    assert est is not None and est.used is None and est.samples == 100
    assert fractions_used({("a", "b"): 0.5}, {("a", "b"): est}) == {("a", "b"): 0.5}
    est = run([(30, 100), (30, 100)])
    assert est is not None and est.used == pytest.approx(0.3)
    assert fractions_used({("a", "b"): 0.5}, {("a", "b"): est}) == {("a", "b"): 0.3}


@pytest.mark.parametrize(
    ("taken", "answered"),
    [(-1, 10), (11, 10), (math.nan, 10), (1, math.inf), (0, 0), (1, 2**60)],
)
def test_invalid_counts_are_no_evidence(taken: float, answered: float) -> None:
    before = run([(30, 300)])
    assert update_edge(before, taken=taken, answered=answered, policy=POLICY) == before
    assert update_edge(None, taken=taken, answered=answered, policy=POLICY) is None


@settings(max_examples=150, deadline=None)
@given(
    st.floats(min_value=0.03, max_value=0.97),
    st.lists(
        st.tuples(st.floats(min_value=-0.02, max_value=0.02), st.integers(50, 5000)),
        min_size=1,
        max_size=60,
    ),
)
def test_noise_around_a_fraction_never_plans_again(
    p: float, rounds: list[tuple[float, int]]
) -> None:
    """Rounds whose fraction stays within 0.02 of ``p``: once the measured fraction is used
    it never changes (each change would plan the pipeline again)."""
    est, used = None, []
    for noise, answered in rounds:
        fraction = min(1.0, max(0.0, p + noise))
        est = update_edge(est, taken=fraction * answered, answered=answered, policy=POLICY)
        assert est is not None
        if est.used is not None:
            used.append(est.used)
            assert abs(est.used - p) <= 0.02 + POLICY.step
    assert len(set(used)) <= 1


@settings(max_examples=100, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(100, 2000),
)
def test_a_sustained_change_is_followed(p: float, q: float, answered: int) -> None:
    rounds = [(p * answered, answered)] * 20 + [(q * answered, answered)] * 60
    est = run(rounds)
    assert est is not None and est.used is not None
    assert abs(est.used - q) <= POLICY.min_change + POLICY.step


def _exact(order: list[str], edges: dict[tuple[str, str], float]) -> dict[str, float]:
    """Every combination of edge draws, weighted: the share of queries visiting each stage."""
    keys = list(edges)
    out = dict.fromkeys(order, 0.0)
    for draws in itertools.product([True, False], repeat=len(keys)):
        weight = math.prod(
            edges[k] if d else 1 - edges[k] for k, d in zip(keys, draws, strict=True)
        )
        taken = dict(zip(keys, draws, strict=True))
        visits: dict[str, bool] = {}
        for name in order:
            ins = [k for k in keys if k[1] == name]
            visits[name] = not ins or any(visits[k[0]] and taken[k] for k in ins)
            out[name] += weight * visits[name]
    return out


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_scale_factors_match_brute_force_on_trees(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 7))
    order = [f"s{i}" for i in range(n)]
    edges = {}
    for i in range(1, n):
        if data.draw(st.booleans()):  # else a second root
            parent = data.draw(st.integers(0, i - 1))
            edges[(order[parent], order[i])] = data.draw(st.floats(0.0, 1.0))
    got, want = scale_factors(order, edges), _exact(order, edges)
    assert got == pytest.approx(want, abs=1e-9)


def test_a_join_of_independent_branches() -> None:
    # two roots feeding one stage: exact, the parents' visits are independent
    edges = {("a", "c"): 0.5, ("b", "c"): 0.2}
    assert scale_factors(["a", "b", "c"], edges) == pytest.approx(_exact(["a", "b", "c"], edges))


def test_stage_demand_is_the_ingress_times_the_scale_factor() -> None:
    assert stage_demand(400.0, 0.25) == 100.0
    assert stage_demand(400.0, 1.5) == 400.0  # a factor is at most 1
    for bad in (math.nan, math.inf, -math.inf):
        assert stage_demand(bad, 0.5) == 0.0
        assert stage_demand(10.0, bad) == 0.0
    assert stage_demand(-5.0, 0.5) == 0.0


def test_feedback_policy_rejects_bad_settings() -> None:
    for kwargs in ({"min_samples": 0}, {"half_life": 0.0}, {"min_change": 1.0}, {"step": 0}):
        with pytest.raises(ValueError):
            FeedbackPolicy(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 500), st.floats(0.0, 1.0))
def test_thinning_keeps_the_scale_factors_share_evenly(n: int, s: float) -> None:
    times = [float(i) for i in range(n)]
    kept = thin(times, s)
    assert len(kept) == math.floor(n * s)
    assert kept == sorted(kept) and set(kept) <= set(times)
    assert thin(times, math.nan) == [] and thin(times, 2.0) == times


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=20), st.floats(0.0, 1.0))
def test_thinning_read_by_read_keeps_the_share_of_them_all(sizes: list[int], s: float) -> None:
    phase, kept = 0.0, 0
    for n in sizes:
        kept += len(thin([0.0] * n, s, phase))
        phase = thin_phase(n, s, phase)
    assert abs(kept - sum(sizes) * s) < 1 + 1e-6  # as if thinned at once, up to rounding
