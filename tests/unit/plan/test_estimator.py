"""Packrat's batch-size estimator: EWMA (alpha 0.1), floor to a power of two, mode over a window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.estimator import (
    BatchSizeEstimator,
    estimate_series,
    floor_pow2,
    nearest_pow2,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 1), (0.5, 1), (1, 1), (1.99, 1), (2, 2), (3.9, 2), (4, 4), (31.9, 16), (32, 32), (33, 32)],
)
def test_floor_pow2(value: float, expected: int) -> None:
    assert floor_pow2(value) == expected


def test_first_sample_seeds_the_average() -> None:
    est = BatchSizeEstimator(window=5)
    assert est.observe(8) == 8
    assert est.ewma == 8.0


def test_ewma_uses_alpha_point_one() -> None:
    est = BatchSizeEstimator(window=1)
    est.observe(0)
    est.observe(10)
    assert est.ewma == pytest.approx(1.0)
    est.observe(10)
    assert est.ewma == pytest.approx(0.1 * 10 + 0.9 * 1.0)


def test_steady_load_converges_to_its_power_of_two() -> None:
    series = estimate_series([12.0] * 300, window=20)
    assert series[-1] == 8  # 12 floors to 8


def test_single_spike_does_not_flip_the_estimate() -> None:
    est = BatchSizeEstimator(window=50)
    for _ in range(200):
        est.observe(4)
    assert est.observe(400) == 4  # ewma jumps to ~43.6 once, mode stays 4
    for _ in range(5):
        est.observe(4)
    assert est.estimate == 4


def test_sustained_change_moves_the_estimate() -> None:
    est = BatchSizeEstimator(window=50)
    for _ in range(200):
        est.observe(4)
    for _ in range(300):
        est.observe(40)  # the average approaches 40 from below: floors to 32
    assert est.estimate == 32


def test_mode_ties_go_to_the_most_recent_value() -> None:
    est = BatchSizeEstimator(alpha=1.0, window=4)
    for depth in (2, 2, 8, 8):
        est.observe(depth)
    assert est.estimate == 8


def test_clamp() -> None:
    est = BatchSizeEstimator(alpha=1.0, window=1, min_batch=2, max_batch=16)
    assert est.estimate == 2
    assert est.observe(0) == 2
    assert est.observe(100) == 16


def test_window_forgets_old_values() -> None:
    est = BatchSizeEstimator(alpha=1.0, window=3)
    for depth in (16, 16, 16, 4, 4):
        est.observe(depth)
    assert est.estimate == 4
    assert est.samples == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0},
        {"alpha": 1.5},
        {"window": 0},
        {"min_batch": 0},
        {"min_batch": 4, "max_batch": 2},
    ],
)
def test_invalid_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BatchSizeEstimator(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("depth", [-1.0, float("nan"), float("inf")])
def test_invalid_samples(depth: float) -> None:
    with pytest.raises(ValueError):
        BatchSizeEstimator().observe(depth)


def test_reset() -> None:
    est = BatchSizeEstimator()
    est.observe(64)
    est.reset()
    assert est.samples == 0
    assert est.estimate == 1


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=200))
def test_estimate_is_a_power_of_two_within_the_observed_range(depths: list[float]) -> None:
    est = BatchSizeEstimator(window=16)
    for d in depths:
        value = est.observe(d)
        assert value & (value - 1) == 0
        assert 1 <= value <= max(1.0, *depths)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, 1),
        (1.0, 1),
        (1.41, 1),
        (1.42, 2),
        (2.8, 2),
        (2.9, 4),
        (5.5, 4),
        (6.0, 8),
        (8.0, 8),
        (11.0, 8),
        (12.0, 16),
        (float("nan"), 1),
    ],
)
def test_nearest_pow2_rounds_on_a_log_scale(value: float, expected: int) -> None:
    assert nearest_pow2(value) == expected


@pytest.mark.parametrize("burst", [2, 8, 16])
def test_nearest_reads_a_partly_drained_burst_as_the_burst(burst: int) -> None:
    """Burst-synchronised clients: the outstanding depth runs from B down to about B/2
    (answers leave as the batch finishes), so the mean is ~0.75 B. Flooring halves it (the
    bias measured in the reconfiguration experiment); the nearest power of two does not."""
    cycle = [burst - i * (burst / 2) / 20 for i in range(20)]  # B .. B/2
    depths = cycle * 50
    assert estimate_series(depths)[-1] == burst // 2
    assert estimate_series(depths, rounding="nearest")[-1] == burst


def test_nearest_still_follows_a_real_halving() -> None:
    depths = [8.0] * 400 + [4.0] * 800
    assert estimate_series(depths, rounding="nearest")[-1] == 4
    with pytest.raises(ValueError, match="rounding"):
        BatchSizeEstimator(rounding="ceil")


@given(
    depths=st.lists(
        st.tuples(st.floats(min_value=0, max_value=64), st.integers(min_value=1, max_value=30)),
        min_size=1,
        max_size=40,
    )
)
@settings(max_examples=60, deadline=None)
def test_observing_a_depth_n_times_at_once_is_observing_it_n_times(
    depths: list[tuple[float, int]],
) -> None:
    """``observe(depth, times=n)`` (a late sampler's missed ticks) is n single samples."""
    at_once = BatchSizeEstimator(window=50, rounding="nearest")
    one_by_one = BatchSizeEstimator(window=50, rounding="nearest")
    for depth, n in depths:
        got = at_once.observe(depth, times=n)
        for _ in range(n):
            want = one_by_one.observe(depth)
        assert got == want
        assert at_once.state() == one_by_one.state()
    with pytest.raises(ValueError, match="times"):
        at_once.observe(1.0, times=0)


def test_a_late_sample_stands_for_the_ticks_it_missed() -> None:
    from packrat.serve.dispatcher.sampler import MAX_TICKS, ticks

    assert ticks(0.005, 0.005) == 1
    assert ticks(0.0052, 0.005) == 1  # the sleep's own overshoot
    assert ticks(0.031, 0.005) == 6  # a busy event loop: six 5 ms ticks
    assert ticks(30.0, 0.005) == MAX_TICKS  # a stall is not a depth held all along
    assert ticks(0.0, 0.005) == ticks(-1.0, 0.005) == ticks(float("nan"), 0.005) == 1
