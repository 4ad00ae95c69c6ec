"""Traffic envelopes against brute force, and the tuner on synthetic steps and bursts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.envelope import (
    Tuner,
    envelope,
    growth_within,
    replay,
    schedule,
    window_sizes,
)
from packrat.plan.traces import gamma_trace, step_trace

WINDOWS = window_sizes(0.2)


def brute_envelope(times: list[float], w: float) -> float:
    return max(sum(1 for u in times if t <= u < t + w) for t in times) / w


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from([0.1, 0.5, 1.0, 7.0]),
)
def test_envelope_matches_brute_force(values: list[float], w: float) -> None:
    times = sorted(values)
    assert envelope(np.array(times), [w])[0] == pytest.approx(brute_envelope(times, w))


def test_window_sizes_double_from_twice_the_service_time_to_60_s() -> None:
    assert window_sizes(0.25) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert window_sizes(40.0) == [60.0]
    assert window_sizes(0.001, min_window_s=0.1)[:3] == [0.1, 0.2, 0.4]
    with pytest.raises(ValueError, match="service time"):
        window_sizes(0.0)


def test_envelope_is_non_increasing_for_poisson_arrivals() -> None:
    rates = envelope(gamma_trace(100.0, duration_s=120.0, seed=2), WINDOWS)
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert rates[-1] == pytest.approx(100.0, rel=0.15)


def make_tuner(planned_trace: np.ndarray, **kw: float) -> Tuner:
    return Tuner(
        planned_replicas=3,
        replica_capacity=40.0,
        windows=WINDOWS,
        planned_rates=envelope(planned_trace, WINDOWS),
        max_replicas=int(kw.pop("max_replicas", 50)),
        scale_down_delay_s=kw.pop("delay", 120.0),
    )


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_scales_up_within_one_window_of_a_rate_step(factor: float) -> None:
    tuner = make_tuner(gamma_trace(100.0, duration_s=120.0, seed=1))
    trace = step_trace([100.0, 100.0 * factor], phase_s=120.0, seed=5)
    decisions = replay(tuner, trace)
    first_up = next(d for d in decisions if d.action == "scale_up" and d.time_s > 120.0)
    assert first_up.time_s <= 120.0 + WINDOWS[1] + 1.0  # the step, one short window, a tick
    assert "scale up" in first_up.reason and "window" in first_up.reason
    # by the end the longest window sees the new rate: enough replicas for it
    assert decisions[-1].replicas >= math.ceil(100.0 * factor / 40.0)


def test_does_not_flap_on_a_steady_bursty_trace() -> None:
    planned = gamma_trace(100.0, cv=4.0, duration_s=120.0, seed=1)
    tuner = make_tuner(planned)
    decisions = replay(tuner, gamma_trace(100.0, cv=4.0, duration_s=600.0, seed=9))
    changes = [d for d in decisions if d.action != "hold"]
    downs = [d for d in changes if d.action == "scale_down"]
    assert len(changes) <= 3, [d.reason for d in changes]
    for down in downs:  # a scale-down is never undone within the delay
        assert not any(
            d.action == "scale_up" and down.time_s < d.time_s <= down.time_s + 120.0
            for d in changes
        )


@pytest.mark.parametrize("seed", [3, 9, 17])
def test_noise_margin_ignores_counting_noise_but_not_a_step(seed: int) -> None:
    """At a low rate the windows hold a few arrivals: one more is noise. With the z sqrt(k)
    margin a steady trace never scales; a 4x step is still caught within seconds."""
    sample = gamma_trace(2.0, duration_s=60.0, seed=1)
    windows = window_sizes(0.001, min_window_s=0.1)

    def tuner(z: float) -> Tuner:
        return Tuner(
            planned_replicas=1,
            replica_capacity=1000.0,
            windows=windows,
            planned_rates=envelope(sample, windows),
            noise_z=z,
        )

    steady = gamma_trace(2.0, duration_s=300.0, seed=seed)
    assert all(d.action == "hold" for d in replay(tuner(3.0), steady))
    step = step_trace([2.0, 8.0], phase_s=60.0, seed=seed)
    up = next(d for d in replay(tuner(3.0), step) if d.action == "scale_up")
    assert 60.0 < up.time_s <= 60.0 + 10.0, up


def test_scales_down_only_after_the_trailing_window() -> None:
    tuner = make_tuner(gamma_trace(100.0, duration_s=120.0, seed=1), delay=120.0)
    trace = step_trace([400.0, 50.0], phase_s=200.0, seed=4)
    decisions = replay(tuner, trace)
    peak = max(d.replicas for d in decisions)
    assert peak >= 10
    first_down = next(d for d in decisions if d.action == "scale_down")
    # the 60 s horizon must forget the high rate, then 120 s more without wanting it
    assert first_down.time_s >= 200.0 + 120.0
    assert decisions[-1].replicas < peak
    assert "scale down" in first_down.reason


def test_min_and_max_replicas_bound_decisions() -> None:
    tuner = make_tuner(gamma_trace(100.0, duration_s=60.0, seed=1), max_replicas=5)
    decisions = replay(tuner, gamma_trace(1000.0, duration_s=30.0, seed=2))
    assert max(d.replicas for d in decisions) == 5
    idle = Tuner(
        planned_replicas=3,
        replica_capacity=40.0,
        windows=WINDOWS,
        min_replicas=2,
        scale_down_delay_s=10.0,
    )
    out = [idle.decide(float(t)) for t in range(0, 30)]
    assert out[-1].replicas == 2 and all(d.replicas >= 2 for d in out)


def test_a_late_reading_is_merged_not_dropped() -> None:
    tuner = make_tuner(gamma_trace(100.0, duration_s=60.0, seed=1))
    early, late = [10.0 + i * 0.001 for i in range(50)], [11.0 + i * 0.001 for i in range(50)]
    tuner.observe(late)
    tuner.observe(early)  # another pod's arrivals, read one poll later
    merged = list(tuner._arrivals)
    assert merged == sorted(early + late)


def test_memory_is_bounded() -> None:
    tuner = Tuner(planned_replicas=1, replica_capacity=10.0, windows=[1.0], max_events=100)
    tuner.observe(np.arange(0, 1000, 0.001).tolist())
    assert len(tuner._arrivals) == 100
    tuner.rates(2000.0)
    assert len(tuner._arrivals) == 0


def test_schedule_lists_changes() -> None:
    tuner = make_tuner(gamma_trace(100.0, duration_s=60.0, seed=1))
    decisions = replay(tuner, step_trace([100.0, 400.0], phase_s=60.0, seed=3))
    steps = schedule(decisions, initial=3)
    assert steps[0] == (0.0, 3)
    assert all(b[0] > a[0] and b[1] != a[1] for a, b in itertools.pairwise(steps))
    assert all(d.to_dict()["action"] in {"scale_up", "scale_down", "hold"} for d in decisions)


# -- start-up time (issue 27 item 3) --------------------------------------------------------
def brute_growth(times: list[float], horizon: float, z: float) -> float:
    """Every window of w = max(h, 1) ending at t0 + w + k w/4, against the one h later."""
    w = max(horizon, 1.0)
    t0, span = times[0], times[-1] - times[0]
    best, k = 1.0, 0
    while w / 4 * k <= span - w - horizon + 1e-9:
        end = t0 + w + k * w / 4
        before = sum(1 for u in times if end - w <= u < end)
        after = sum(1 for u in times if end + horizon - w <= u < end + horizon)
        if before >= 10:
            lo = before + z * math.sqrt(before)
            best = max(best, (after - z * math.sqrt(after)) / lo)
        k += 1
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 40, allow_nan=False), min_size=2, max_size=150),
    st.sampled_from([0.5, 2.0, 5.0]),
    st.sampled_from([0.0, 1.0, 2.0]),
)
def test_growth_within_matches_brute_force(values: list[float], horizon: float, z: float) -> None:
    times = sorted(values)
    got = growth_within(np.array(times), horizon, noise_z=z)
    assert got == pytest.approx(brute_growth(times, horizon, z), rel=1e-9)


def test_growth_reads_a_step_not_counting_noise() -> None:
    assert growth_within(gamma_trace(50.0, duration_s=300.0, seed=3), 6.0, noise_z=2.0) < 1.15
    step = step_trace([50.0, 200.0], phase_s=60.0, seed=3)
    assert growth_within(step, 6.0, noise_z=1.0) > 3.0
    assert growth_within(step, 6.0, noise_z=1.0, max_points=5) >= 1.0  # bounded work
    # a low rate: a few arrivals per window are no rate to grow from
    assert growth_within(gamma_trace(2.0, duration_s=60.0, seed=1), 1.0, noise_z=1.0) == 1.0


def step_tuner(sample: np.ndarray, **kw: float) -> Tuner:
    windows = window_sizes(0.2)
    return Tuner(
        planned_replicas=4,
        replica_capacity=60.0,
        windows=windows,
        planned_rates=envelope(sample, windows),
        scale_down_delay_s=30.0,
        noise_z=3.0,
        **kw,  # type: ignore[arg-type]
    )


def test_startup_headroom_holds_what_a_step_within_a_startup_needs() -> None:
    """The sample shows a 4x step: without start-up time the tuner scales down in the quiet
    phase and meets the next step with a quarter of the replicas; with a 5 s start-up it
    keeps the planned count, and never asks for more than that at the peak."""
    sample = step_trace([50.0, 200.0], phase_s=90.0, seed=2)
    trace = step_trace([50.0, 200.0], phase_s=150.0, seed=7)
    plain = replay(step_tuner(sample), trace)
    growth = growth_within(sample, 6.0, noise_z=1.0)
    aware = replay(step_tuner(sample, startup_s=5.0, growth=growth), trace)
    quiet = [d.replicas for d in plain if 100.0 < d.time_s < 150.0]
    assert min(quiet) < 4  # scaled down before the step
    assert all(d.replicas == 4 for d in aware), {d.replicas for d in aware}


def test_startup_headroom_scales_a_ramp_up_earlier() -> None:
    rng = np.random.default_rng(4)
    t = np.sort(rng.uniform(0.0, 240.0, rng.poisson(200.0 * 240.0)))
    rate = 50.0 + 150.0 * np.clip((t - 120.0) / 60.0, 0.0, 1.0)
    ramp = t[rng.uniform(0.0, 200.0, t.size) < rate]
    sample = ramp[ramp > 0]  # the same process
    plain = replay(step_tuner(sample), ramp)
    aware = replay(step_tuner(sample, startup_s=5.0, growth=1.25), ramp)
    for n in (2, 3):
        first = [
            next(d.time_s for d in ds if d.time_s > 120 and d.replicas >= n)
            for ds in (plain, aware)
        ]
        assert first[1] <= first[0], first


def test_startup_settings_are_checked() -> None:
    for kw in ({"startup_s": -1.0}, {"growth": 0.5}, {"startup_s": math.inf}):
        with pytest.raises(ValueError):
            step_tuner(np.array([0.0, 1.0]), **kw)
    with pytest.raises(ValueError, match="horizon"):
        growth_within(np.array([0.0, 1.0]), 0.0)
