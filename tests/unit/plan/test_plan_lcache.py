"""LCache's residency policy against brute force on small cases, and its pieces' properties."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.pool.lcache import (
    Curve,
    ModelLayers,
    cold_latency,
    evictions,
    latency_curve,
    loads,
    lru_access,
    pipeline_latency,
    plan_curves,
    plan_residency,
    sweet_spot,
    trim_to_budget,
)

times = st.floats(0, 10, allow_nan=False, allow_infinity=False)


def critical_path(copy: list[float], compute: list[float]) -> float:
    """The unbounded pipeline's latency as the longest path: all compute, or the transfer up to
    some layer j then the compute from j on."""
    paths = [sum(compute)]
    paths += [sum(copy[: j + 1]) + sum(compute[j:]) for j in range(len(copy)) if copy[j] > 0]
    return max(paths)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(times, times), min_size=0, max_size=8))
def test_pipeline_latency_is_the_critical_path(layers: list[tuple[float, float]]) -> None:
    copy = [c for c, _ in layers]
    compute = [x for _, x in layers]
    assert pipeline_latency(copy, compute) == pytest.approx(critical_path(copy, compute), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 10), times), min_size=1, max_size=8))
def test_lookahead_bounds_the_overlap(layers: list[tuple[float, float]]) -> None:
    copy = [c for c, _ in layers]
    compute = [x for _, x in layers]
    # no lookahead: each layer is brought after the previous one ran, nothing overlaps
    assert pipeline_latency(copy, compute, lookahead=0) == pytest.approx(sum(copy) + sum(compute))
    lat = [pipeline_latency(copy, compute, lookahead=k) for k in range(len(layers) + 1)]
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(lat))
    assert lat[-1] == pytest.approx(pipeline_latency(copy, compute))
    assert lat[-1] >= max(sum(copy), sum(compute)) - 1e-9


def model(name: str, sizes: list[int], compute: list[float], rate: float) -> ModelLayers:
    return ModelLayers(name, tuple(sizes), tuple(compute), rate)


layer = st.tuples(st.integers(0, 6), st.floats(0.0, 3.0))
models_st = st.lists(
    st.tuples(st.lists(layer, min_size=1, max_size=4), st.floats(0.0, 5.0)), min_size=1, max_size=3
)


Raw = list[tuple[list[tuple[int, float]], float]]


def build(raw: Raw, unit: int) -> list[ModelLayers]:
    return [
        model(f"m{i}", [b * unit for b, _ in ls], [x for _, x in ls], rate)
        for i, (ls, rate) in enumerate(raw)
    ]


def brute(curves: list[Curve], budget: int) -> float:
    best = math.inf
    for ps in itertools.product(*(range(len(c.latency_s)) for c in curves)):
        if sum(c.bytes_[p] for c, p in zip(curves, ps, strict=True)) <= budget:
            best = min(best, sum(c.rate * c.latency_s[p] for c, p in zip(curves, ps, strict=True)))
    return best


@settings(max_examples=200, deadline=None)
@given(models_st, st.integers(0, 30), st.sampled_from([1.0, 2.5, 10.0]))
def test_plan_is_the_brute_force_optimum_on_the_grid(
    raw: Raw, budget_units: int, rate_bps: float
) -> None:
    unit = 1000
    ms = build(raw, unit)
    curves = [latency_curve(m, rate_bps / unit) for m in ms]
    plan = plan_residency(ms, rate_bps / unit, budget_units * unit, granularity=unit)
    assert plan.bytes_used <= budget_units * unit
    assert plan.weighted_latency == pytest.approx(brute(curves, budget_units * unit), abs=1e-9)
    for m in ms:
        assert plan.bytes_used >= 0 and 0 <= plan.prefix[m.name] <= len(m.layer_bytes)


@settings(max_examples=150, deadline=None)
@given(models_st, st.integers(0, 40), st.integers(1, 7))
def test_off_grid_sizes_stay_within_budget_and_near_optimal(raw: Raw, budget: int, g: int) -> None:
    ms = build(raw, 1)
    curves = [latency_curve(m, 2.0) for m in ms]
    plan = plan_curves(curves, budget, granularity=g)
    assert plan.bytes_used <= budget
    # rounding loses at most one grid unit per model
    assert plan.weighted_latency <= brute(curves, budget - len(ms) * g) + 1e-9
    assert plan.weighted_latency >= brute(curves, budget) - 1e-9


@settings(max_examples=150, deadline=None)
@given(st.lists(layer, min_size=1, max_size=6), st.floats(0.1, 10))
def test_curve_falls_to_warm_and_sweet_spot_is_the_first_within_tolerance(
    ls: list[tuple[int, float]], rate_bps: float
) -> None:
    m = model("m", [b for b, _ in ls], [x for _, x in ls], 1.0)
    curve = latency_curve(m, rate_bps)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(curve.latency_s))
    assert curve.latency_s[-1] == pytest.approx(sum(m.compute_s))
    p = sweet_spot(curve)
    assert curve.latency_s[p] <= 1.1 * curve.latency_s[-1] + 1e-12
    assert all(curve.latency_s[q] > 1.1 * curve.latency_s[-1] for q in range(p))


def test_a_resident_prefix_hides_the_rest_of_the_transfer() -> None:
    # 4 layers of 10 bytes at 10 B/s (1 s each), 1 s compute each: nothing resident waits 1 s
    # for layer 0 then runs behind the stream (5 s); one layer resident runs layer 0 while
    # layer 1 loads: 4 s, warm.
    m = model("m", [10] * 4, [1.0] * 4, 1.0)
    assert cold_latency(m, 0, 10.0) == pytest.approx(5.0)
    assert cold_latency(m, 1, 10.0) == pytest.approx(4.0)
    assert sweet_spot(latency_curve(m, 10.0)) == 1


def test_hot_models_get_their_prefix_first() -> None:
    # slow transfer: a cold model costs 5x warm; the budget holds one whole model
    hot = model("hot", [10] * 4, [1.0] * 4, 10.0)
    cold = model("cold", [10] * 4, [1.0] * 4, 0.1)
    plan = plan_residency([hot, cold], 2.0, 40, granularity=10)
    # hot: 21 s cold, 16, 11, 6, 4 warm; each layer it keeps saves 10x what one of cold's would
    assert latency_curve(hot, 2.0).latency_s == pytest.approx((21.0, 16.0, 11.0, 6.0, 4.0))
    assert plan.prefix == {"hot": 4, "cold": 0}
    assert plan.bytes_used == 40


@settings(max_examples=150, deadline=None)
@given(models_st, st.integers(0, 30))
def test_trim_only_shrinks_and_fits(raw: Raw, budget: int) -> None:
    ms = build(raw, 1)
    curves = [latency_curve(m, 3.0) for m in ms]
    full = {m.name: len(m.layer_bytes) for m in ms}
    out = trim_to_budget(curves, full, budget)
    assert out.bytes_used <= budget
    assert all(out.prefix[n] <= full[n] for n in full)
    # a single model: trimming from the tail keeps the longest prefix that fits
    c = curves[0]
    one = trim_to_budget([c], {c.name: len(c.bytes_) - 1}, budget)
    assert one.prefix[c.name] == max(p for p, b in enumerate(c.bytes_) if b <= budget)


def test_evictions_go_tail_first_and_loads_front_first() -> None:
    cur = {"a": 4, "b": 1}
    tgt = {"a": 2, "b": 3}
    assert evictions(cur, tgt) == [("a", 3), ("a", 2)]
    assert loads(cur, tgt) == [("b", 1), ("b", 2)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.integers(0, 12))
def test_lru_matches_a_reference_and_holds_its_budget(reqs: list[int], budget: int) -> None:
    sizes = {f"m{i}": 1 + i % 4 for i in range(6)}
    resident: tuple[str, ...] = ()
    ref: list[str] = []
    for r in reqs:
        name = f"m{r}"
        step = lru_access(resident, sizes, budget, name)
        hit = name in ref
        if hit:
            ref.remove(name)
            ref.append(name)
        elif sizes[name] <= budget:
            while sum(sizes[m] for m in ref) + sizes[name] > budget:
                ref.pop(0)
            ref.append(name)
        assert step.hit == hit
        assert list(step.resident) == ref
        assert sum(sizes[m] for m in step.resident) <= budget
        resident = step.resident


def test_bad_inputs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="sizes for"):
        ModelLayers("x", (1, 2), (1.0,), 1.0)
    with pytest.raises(ValueError, match="rate"):
        ModelLayers("x", (1,), (1.0,), -1.0)
    with pytest.raises(ValueError, match="unique"):
        c = latency_curve(model("x", [1], [1.0], 1.0), 1.0)
        plan_curves([c, c], 10)
    with pytest.raises(ValueError, match="prefix"):
        cold_latency(model("x", [1], [1.0], 1.0), 2, 1.0)
