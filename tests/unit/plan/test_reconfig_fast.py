"""The fast reconfiguration trigger (issue 27 item 4): fires on a sustained change and on
frequent batch timeouts, and never flaps on noisy input (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.reconfig import (
    Fast,
    FastLook,
    FastPolicy,
    FastState,
    FastVerdict,
    Policy,
    fast_due,
    fast_trigger,
    timeout_fraction,
)

POLICY = Policy(min_batch=1, max_batch=64, sustain=3, min_interval_s=60, min_gain=0.05)
FAST = FastPolicy(sustain_s=1.0, min_interval_s=5.0, timeout_high=0.5, timeout_low=0.2)


def look(observed: int, stable: float | None = None, fraction: float | None = None) -> FastLook:
    return FastLook(observed=observed, stable_s=stable, timeout_fraction=fraction)


def verdict(
    current: int, lk: FastLook, state: FastState | None = None, now: float = 100.0
) -> FastVerdict:
    return fast_trigger(
        fast=FAST, policy=POLICY, current=current, look=lk, state=state or FastState(), now=now
    )


def test_a_change_held_for_the_sustain_time_fires() -> None:
    assert verdict(8, look(32, stable=1.2)).reason is Fast.SUSTAINED
    assert verdict(8, look(32, stable=0.5)).reason is Fast.NONE  # not held long enough
    assert verdict(8, look(32, stable=None)).reason is Fast.NONE  # the pods did not say
    assert verdict(8, look(8, stable=30.0)).reason is Fast.NONE  # no change
    assert verdict(64, look(1000, stable=5.0)).reason is Fast.NONE  # clamped to the range: same


def test_a_neighbouring_batch_must_hold_twice_as_long() -> None:
    """The next power of two up or down is what noise on a steady load reads as (in the
    DES's steady 50/s such blips held up to 1.0 s and each cost a switch there and back); a
    larger change is a real one and fires after ``sustain_s``."""
    assert FAST.near_hold == 2.0
    assert verdict(4, look(8, stable=1.0)).reason is Fast.NONE  # the blip the DES saw
    assert verdict(4, look(8, stable=1.9)).reason is Fast.NONE
    assert verdict(4, look(8, stable=2.0)).reason is Fast.SUSTAINED
    assert verdict(8, look(4, stable=1.5)).reason is Fast.NONE  # down as well as up
    assert verdict(8, look(4, stable=2.0)).reason is Fast.SUSTAINED
    assert verdict(4, look(16, stable=1.0)).reason is Fast.SUSTAINED  # 4x: at once
    assert verdict(16, look(4, stable=1.0)).reason is Fast.SUSTAINED
    assert verdict(16, look(4, stable=0.1, fraction=0.8)).reason is Fast.TIMEOUTS  # unchanged
    assert FAST.hold_s(6, 12) == 2.0 and FAST.hold_s(6, 13) == 1.0  # any batch, not just 2^k


def test_frequent_timeouts_fire_only_towards_a_smaller_batch_and_disarm() -> None:
    fired = verdict(16, look(4, stable=0.1, fraction=0.8))
    assert fired.reason is Fast.TIMEOUTS and not fired.state.armed
    assert verdict(4, look(16, stable=0.1, fraction=0.9)).reason is Fast.NONE  # larger: no
    assert verdict(16, look(4, fraction=0.3)).reason is Fast.NONE  # not frequent
    again = verdict(16, look(4, fraction=0.9), state=fired.state)
    assert again.reason is Fast.NONE  # disarmed until the fraction falls to timeout_low
    rearmed = verdict(16, look(16, fraction=0.1), state=fired.state)
    assert rearmed.state.armed


def test_no_fast_switch_too_soon_nor_back_to_the_batch_just_left() -> None:
    recent = FastState(last_at=97.0, last_from=4)
    assert verdict(8, look(16, stable=9.0), state=recent).reason is Fast.NONE  # 3 s ago
    left = FastState(last_at=80.0, last_from=4)
    assert verdict(8, look(4, stable=9.0), state=left).reason is Fast.NONE  # a reversal
    assert verdict(8, look(16, stable=9.0), state=left).reason is Fast.SUSTAINED
    assert verdict(8, look(4, stable=9.0), state=left, now=141.0).fire  # after min_interval


def test_disabled_never_fires() -> None:
    off = FastPolicy(sustain_s=0)
    out = fast_trigger(
        fast=off, policy=POLICY, current=8, look=look(1, 99.0, 1.0), state=FastState(), now=0
    )
    assert not out.fire


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sustain_s": -1.0},
        {"sustain_s": float("nan")},
        {"near_hold": 0.5},
        {"near_hold": float("inf")},
        {"min_interval_s": float("inf")},
        {"timeout_low": 0.6, "timeout_high": 0.5},
        {"timeout_high": 1.5},
        {"min_batches": 0},
    ],
)
def test_fast_policy_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FastPolicy(**kwargs)  # type: ignore[arg-type]


def test_timeout_fraction_accumulates_and_restarts_on_a_counter_reset() -> None:
    assert timeout_fraction(None, (10, 5), min_batches=20) == (None, (10, 5))
    assert timeout_fraction((10, 5), (20, 5), min_batches=20) == (None, (10, 5))  # 10 batches
    assert timeout_fraction((10, 5), (20, 20), min_batches=20) == (15 / 25, (20, 20))
    assert timeout_fraction((10, 5), (3, 9), min_batches=20) == (None, (3, 9))  # a pod restarted


LOOKS = st.lists(
    st.tuples(
        st.floats(min_value=0.2, max_value=3.0),  # seconds to the next look
        st.sampled_from([1, 2, 4, 8, 16, 32]),
        st.one_of(st.none(), st.floats(min_value=0.0, max_value=5.0)),
        st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(LOOKS)
def test_noisy_input_never_flaps(
    looks: list[tuple[float, int, float | None, float | None]],
) -> None:
    """Whatever the pods report, switching on every fire: fast switches are at least
    ``FAST.min_interval_s`` apart, no switch returns to the batch the previous one left
    within ``POLICY.min_interval_s``, a sustained fire to a neighbouring batch has held
    ``near_hold`` times ``sustain_s``, and two timeout fires have a calm look between them."""
    now, current, state = 0.0, 8, FastState()
    switches: list[tuple[float, int, int]] = []  # (time, from, to)
    calm_since_timeouts = True
    for gap, observed, stable, fraction in looks:
        now += gap
        out = fast_trigger(
            fast=FAST,
            policy=POLICY,
            current=current,
            look=look(observed, stable, fraction),
            state=state,
            now=now,
        )
        if fraction is not None and fraction <= FAST.timeout_low:
            calm_since_timeouts = True
        state = out.state
        if not out.fire:
            continue
        if out.reason is Fast.SUSTAINED and max(current, observed) <= 2 * min(current, observed):
            assert stable is not None and stable >= FAST.near_hold * FAST.sustain_s
        if out.reason is Fast.TIMEOUTS:
            assert calm_since_timeouts
            calm_since_timeouts = False
        if switches:
            at, left, _ = switches[-1]
            assert now - at >= FAST.min_interval_s
            assert not (observed == left and now - at < POLICY.min_interval_s)
        switches.append((now, current, observed))
        state = FastState(armed=state.armed, last_at=now, last_from=current)
        current = observed


def test_a_step_in_the_load_is_acted_on_within_about_two_seconds() -> None:
    """The pod's estimator (sampled every 5 ms, nearest rounding, its 200-sample window) on
    a queue depth stepping from 2 to 16 at t=10 s, read by the operator every second: the
    fast trigger fires about 2 s after the step (the slow rules: 3 reads and 60 s apart)."""
    from packrat.plan.estimator import BatchSizeEstimator

    est = BatchSizeEstimator(window=200, rounding="nearest")
    held_since, value, fired_at = 0.0, est.estimate, None
    for i in range(int(20 / 0.005)):
        t = i * 0.005
        est.observe(2.0 if t < 10.0 else 16.0)
        if est.estimate != value:
            value, held_since = est.estimate, t
        if i % 200 == 0 and t > 0:  # the operator's read, every second
            out = fast_trigger(
                fast=FAST,
                policy=POLICY,
                current=2,
                look=look(est.estimate, stable=t - held_since),
                state=FastState(),
                now=t,
            )
            if out.fire:
                fired_at = t
                break
    assert fired_at is not None and 10.0 < fired_at <= 12.5  # measured: 12.0


def test_fast_due_is_the_time_left_until_a_new_estimate_has_held_long_enough() -> None:
    def due(current: int, lk: FastLook, fast: FastPolicy = FAST) -> float | None:
        return fast_due(fast=fast, policy=POLICY, current=current, look=lk)

    assert due(8, look(32, stable=0.3)) == pytest.approx(0.7)
    assert due(8, look(16, stable=0.3)) == pytest.approx(1.7)  # a neighbour: near_hold
    assert due(8, look(32, stable=1.0)) is None  # held long enough: the trigger decides now
    assert due(8, look(16, stable=2.0)) is None
    assert due(8, look(8, stable=0.1)) is None  # no change to wait for
    assert due(64, look(1000, stable=0.1)) is None  # clamped to the range: no change
    assert due(8, look(16, stable=None)) is None  # the pods did not say
    assert due(8, look(16, stable=0.3), FastPolicy(sustain_s=0)) is None  # off
    # after a switch: fast switches 5 s apart, no return to the batch just left for 60 s
    recent = FastState(last_at=97.0, last_from=4)

    def after(current: int, lk: FastLook) -> float | None:
        return fast_due(fast=FAST, policy=POLICY, current=current, look=lk, state=recent, now=99.0)

    assert after(8, look(16, stable=3.0)) == pytest.approx(3.0)  # 5 s after the switch at 97
    assert after(8, look(4, stable=3.0)) == pytest.approx(58.0)  # 60 s: a reversal
    assert (
        fast_due(fast=FAST, policy=POLICY, current=8, look=look(16, 3.0), state=recent, now=110.0)
        is None
    )


@given(
    step_at=st.floats(min_value=3.0, max_value=8.0),
    phase=st.floats(min_value=0.0, max_value=0.995),
)
@settings(max_examples=40, deadline=None)
def test_reading_again_when_due_acts_sustain_seconds_after_the_estimate_changed(
    step_at: float, phase: float
) -> None:
    """The operator reads every second (at ``phase`` within it) and, when a read sees a new
    estimate not held long enough, again when it will have been (``fast_due`` plus 50 ms):
    the trigger fires within 0.1 s of ``sustain_s`` after the pod's estimate changed,
    wherever the step falls between two reads (without the due read: up to a second later)."""
    from packrat.plan.estimator import BatchSizeEstimator

    est = BatchSizeEstimator(window=200, rounding="nearest")
    changed_at, value, next_read, fired_at = 0.0, est.estimate, phase + 1.0, None
    for i in range(int(step_at / 0.005) + 1000):
        t = i * 0.005
        est.observe(2.0 if t < step_at else 16.0)
        if est.estimate != value:
            value, changed_at = est.estimate, t
        if t + 1e-9 < next_read:
            continue
        lk = look(est.estimate, stable=t - changed_at)
        out = fast_trigger(fast=FAST, policy=POLICY, current=2, look=lk, state=FastState(), now=t)
        if out.fire:
            fired_at = t
            break
        due = fast_due(fast=FAST, policy=POLICY, current=2, look=lk)
        next_read = t + (1.0 if due is None else max(0.1, due + 0.05))
    assert fired_at is not None and value == 16
    assert changed_at > step_at
    assert FAST.sustain_s <= fired_at - changed_at <= FAST.sustain_s + 0.1


@given(
    current=st.sampled_from([1, 2, 4, 8, 16]),
    observed=st.sampled_from([1, 2, 4, 8, 16, 32]),
    stable=st.floats(min_value=0.0, max_value=3.0),
    since=st.one_of(st.none(), st.floats(min_value=0.0, max_value=90.0)),
    last_from=st.one_of(st.none(), st.sampled_from([1, 2, 4, 8, 16])),
)
@settings(max_examples=300, deadline=None)
def test_the_trigger_fires_when_fast_due_says_and_not_before(
    current: int, observed: int, stable: float, since: float | None, last_from: int | None
) -> None:
    """``fast_due`` is the trigger's own wait: where it says d seconds, the same estimate
    held d seconds longer fires the trigger (and does not now); where it says None, the
    trigger fires now or the estimate is no change."""
    now = 100.0
    state = FastState(last_at=None if since is None else now - since, last_from=last_from)
    lk = look(observed, stable=stable)
    due = fast_due(fast=FAST, policy=POLICY, current=current, look=lk, state=state, now=now)
    fired_now = verdict(current, lk, state=state, now=now).fire
    if due is None:
        assert fired_now or POLICY.clamp(observed) == current
        return
    assert not fired_now
    later = look(observed, stable=stable + due + 1e-6)
    assert verdict(current, later, state=state, now=now + due + 1e-6).reason is Fast.SUSTAINED
