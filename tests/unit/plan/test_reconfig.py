"""Online reconfiguration rules on synthetic observation streams: sustain, interval, gain."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging_support import ROOT

from packrat.plan.optimizer import Optimizer, Plan, PlanError, optimize
from packrat.plan.profile import load_profile
from packrat.plan.reconfig import (
    Decision,
    Observation,
    Outcome,
    Policy,
    combine_estimates,
    decide,
    plan_latency_at,
    slo_ceiling,
)

PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"


def amdahl_table(cpus: int = 4, max_batch: int = 64) -> dict[tuple[int, int], float]:
    """Thin instances win at large batches: per-thread efficiency falls with width."""
    table = {}
    b = 1
    while b <= max_batch:
        for t in range(1, cpus + 1):
            table[(t, b)] = 2.0 + b * (0.2 + 0.8 / t) * (1 + 0.15 * t)
        b *= 2
    return table


TABLE = amdahl_table()
OPT = Optimizer(TABLE, cpus=4, max_batch=64)
POLICY = Policy(min_batch=1, max_batch=64, sustain=3, min_interval_s=60, min_gain=0.05)


def stream(*batches: int, start: float = 0.0, step: float = 10.0) -> list[Observation]:
    return [Observation(time=start + i * step, batch=b) for i, b in enumerate(batches)]


def _decide(
    history: list[Observation],
    plan: Plan,
    *,
    policy: Policy = POLICY,
    opt: Optimizer = OPT,
    last_switch_at: float | None = None,
    now: float | None = None,
    **overrides: Any,
) -> Decision:
    """``decide`` on ``opt``'s table, ``now`` the last observation's time unless given."""
    return decide(
        policy=policy,
        current_plan=plan,
        table=opt.table,
        optimal_latency=opt.latency,
        history=history,
        last_switch_at=last_switch_at,
        now=now if now is not None else (history[-1].time if history else 0.0),
        **overrides,
    )


def run(history: list[Observation], *, current: int = 1, last_switch_at: float | None = None):  # type: ignore[no-untyped-def]
    return _decide(history, OPT.plan(current), last_switch_at=last_switch_at)


def test_switches_when_a_new_batch_is_sustained_and_worth_it() -> None:
    decision = run(stream(1, 16, 16, 16), current=1)
    assert decision.outcome is Outcome.SWITCH and decision.switch
    assert decision.target == 16
    assert decision.expected_gain is not None and decision.expected_gain > 0.05


def test_holds_until_sustained() -> None:
    assert run(stream(1, 1, 16, 16), current=1).outcome is Outcome.HOLD_NOT_SUSTAINED
    assert run(stream(16, 8, 16), current=1).outcome is Outcome.HOLD_NOT_SUSTAINED
    assert run(stream(16, 16), current=1).outcome is Outcome.HOLD_NOT_SUSTAINED


def test_no_flapping_on_an_alternating_load() -> None:
    outcomes = []
    history: list[Observation] = []
    for i, b in enumerate([2, 16] * 20):
        history.append(Observation(time=i * 10.0, batch=b))
        outcomes.append(run(history, current=2).outcome)
    assert Outcome.SWITCH not in outcomes


def test_holds_when_too_soon_after_the_last_switch() -> None:
    history = stream(16, 16, 16, start=100.0)
    assert run(history, current=1, last_switch_at=90.0).outcome is Outcome.HOLD_TOO_SOON
    assert run(history, current=1, last_switch_at=50.0).outcome is Outcome.SWITCH


def test_holds_when_the_target_is_the_current_batch() -> None:
    assert run(stream(8, 8, 8), current=8).outcome is Outcome.HOLD_SAME


def test_holds_when_the_gain_is_too_small() -> None:
    # Latency barely depends on the batch: the current plan for batch 4, given only batch 2,
    # runs a batch of 2 and is as fast as the optimal plan for 2, so there is nothing to gain.
    table = {(t, b): 1.0 + 0.01 * b for t in (1, 2) for b in (1, 2, 4)}
    opt = Optimizer(table, cpus=2, max_batch=4)
    current = opt.plan(4)
    decision = _decide(stream(2, 2, 2), current, opt=opt, now=20.0)
    assert decision.outcome is Outcome.HOLD_GAIN_TOO_SMALL
    assert decision.expected_gain is not None and decision.expected_gain <= 0.05


def test_a_plan_larger_than_the_load_costs_its_batch_delay_so_a_switch_down_pays() -> None:
    """The same flat profile: keeping the batch-4 plan for a load of 2 waits the batch delay
    on every batch (it never fills), so with ``maxBatchDelayMs`` 5 the plan for 2 is worth
    it; a switch up is not charged the delay (the larger plan's batches fill)."""
    table = {(t, b): 1.0 + 0.01 * b for t in (1, 2) for b in (1, 2, 4)}
    opt = Optimizer(table, cpus=2, max_batch=4)
    delayed = Policy(min_batch=1, max_batch=4, sustain=3, min_interval_s=60, batch_delay_ms=5)

    def decide_from(current: int, load: int, policy: Policy = delayed) -> Decision:
        return _decide(
            stream(load, load, load), opt.plan(current), policy=policy, opt=opt, now=20.0
        )

    down = decide_from(4, 2)
    assert down.outcome is Outcome.SWITCH and down.target == 2
    assert down.expected_gain is not None and down.expected_gain > 0.5
    undelayed = Policy(min_batch=1, max_batch=4, sustain=3, min_interval_s=60)
    assert decide_from(4, 2, undelayed).outcome is Outcome.HOLD_GAIN_TOO_SMALL  # as before
    up = decide_from(2, 4)  # the larger plan's batches fill: the delay is not charged
    assert up.expected_gain == decide_from(2, 4, undelayed).expected_gain
    with pytest.raises(ValueError, match="batch_delay_ms"):
        Policy(batch_delay_ms=float("nan"))


def test_targets_are_clamped_to_the_policy_range() -> None:
    policy = Policy(min_batch=2, max_batch=8, sustain=2, min_interval_s=0, min_gain=0.0)
    decision = _decide(stream(64, 64), OPT.plan(2), policy=policy, now=10.0)
    assert decision.target == 8


def test_no_data_holds() -> None:
    assert run([], current=4).outcome is Outcome.HOLD_NO_DATA


def test_infeasible_target_holds_with_the_reason() -> None:
    table = {(1, 2): 1.0, (2, 2): 0.8, (2, 4): 1.5}
    opt = Optimizer(table, cpus=2, max_batch=8)
    policy = Policy(min_batch=1, max_batch=8, sustain=1, min_interval_s=0, min_gain=0.0)
    decision = _decide(stream(8), opt.plan(2), policy=policy, opt=opt, now=1.0)
    assert decision.outcome is Outcome.HOLD_INFEASIBLE
    assert "no combination" in decision.message


def test_combine_estimates_takes_the_mode_and_breaks_ties_upward() -> None:
    assert combine_estimates([4, 4, 8]) == 4
    assert combine_estimates([4, 8]) == 8
    assert combine_estimates([]) is None
    assert combine_estimates([0]) is None


def test_plan_latency_at_its_own_batch_is_its_expected_latency() -> None:
    for batch in (1, 2, 4, 8, 16, 32, 64):
        plan = OPT.plan(batch)
        assert plan_latency_at(plan, TABLE, batch) == pytest.approx(plan.expected_latency_ms)


def test_plan_latency_at_a_larger_batch_runs_rounds() -> None:
    plan = optimize(TABLE, cpus=4, batch=4)
    # twice the load on the same instances: at least two rounds of the slowest instance
    assert plan_latency_at(plan, TABLE, 8) >= 2 * plan.expected_latency_ms - 1e-9


def test_policy_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="min_batch"):
        Policy(min_batch=8, max_batch=4)
    with pytest.raises(ValueError, match="sustain"):
        Policy(sustain=0)


def test_on_the_papers_resnet_profile_a_load_step_switches_once() -> None:
    path = PAPER / "resnet-pytorch.csv"
    assert path.exists(), f"{path}: the published profiles ship with the repository"
    table = load_profile(path).table()
    opt = Optimizer(table, cpus=16, max_batch=64)
    current = opt.plan(2)
    switches = 0
    history: list[Observation] = []
    last = None
    for i, b in enumerate([2] * 5 + [16] * 10):
        now = i * 30.0
        history.append(Observation(time=now, batch=b))
        d = _decide(history, current, opt=opt, last_switch_at=last, now=now)
        if d.switch:
            switches += 1
            current = opt.plan(d.target or current.batch)
            last = now
    assert switches == 1 and current.batch == 16


def _overridden(history: list[Observation], *, current: int, **kw: Any) -> Decision:
    return _decide(history, OPT.plan(current), **kw)


def test_a_pin_switches_without_sustain_interval_or_gain_then_holds() -> None:
    # no data, a switch one second ago, an unsustained load: the pin still switches
    decision = _overridden(stream(1, 64), current=1, pinned=16, last_switch_at=0.0)
    assert decision.outcome is Outcome.SWITCH and decision.target == 16
    assert "pinned" in decision.message
    # ... once: at the pinned batch it holds whatever the load says
    held = _overridden(stream(64, 64, 64, 64), current=16, pinned=16)
    assert held.outcome is Outcome.HOLD_PINNED and held.target == 16
    # a pin is clamped to the policy range like any target
    policy = Policy(min_batch=2, max_batch=8, sustain=3, min_interval_s=0, min_gain=0.0)
    clamped = _decide([], OPT.plan(2), policy=policy, pinned=64)
    assert clamped.target == 8 and "clamped" in clamped.message


def test_an_infeasible_pin_holds() -> None:
    table = {(1, 2): 1.0, (2, 2): 0.8, (2, 4): 1.5}
    opt = Optimizer(table, cpus=2, max_batch=8)
    decision = _decide([], opt.plan(2), policy=Policy(min_batch=1, max_batch=8), opt=opt, pinned=8)
    assert decision.outcome is Outcome.HOLD_INFEASIBLE


def test_a_trigger_skips_only_the_interval() -> None:
    history = stream(16, 16, 16, start=100.0)
    forced = _overridden(history, current=1, last_switch_at=95.0, ignore_interval=True)
    assert forced.outcome is Outcome.SWITCH
    # sustain and gain still apply
    unsustained = _overridden(stream(1, 16), current=1, last_switch_at=0.0, ignore_interval=True)
    assert unsustained.outcome is Outcome.HOLD_NOT_SUSTAINED
    same = _overridden(stream(4, 4, 4), current=4, ignore_interval=True)
    assert same.outcome is Outcome.HOLD_SAME


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.floats(0.1, 100.0)), st.floats(1.0, 100.0)),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.1, 100.0),
    st.data(),
)
def test_slo_ceiling_is_the_batch_within_the_slo_that_serves_the_most(
    points: list[tuple[float | None, float]], slo_ms: float, data: st.DataObject
) -> None:
    """Against brute force: among the batches in the range whose plan (latency None:
    infeasible) is expected within the SLO, the largest, or with capacities the one that
    serves the most (ties to the larger); the floor when none fits; never outside the
    range."""
    top = len(points)
    floor = data.draw(st.integers(1, top))

    def latency(batch: int) -> float:
        value = points[batch - 1][0]
        if value is None:
            raise PlanError(f"no plan for {batch}")
        return value

    def capacity(batch: int) -> float:
        return points[batch - 1][1]

    fits = [b for b in range(floor, top + 1) if points[b - 1][0] is not None]
    fits = [b for b in fits if latency(b) <= slo_ms]
    assert slo_ceiling(latency, slo_ms=slo_ms, floor=floor, top=top) == max(fits, default=floor)
    most = max((capacity(b) for b in fits), default=None)
    best = max((b for b in fits if capacity(b) == most), default=floor)
    got = slo_ceiling(latency, slo_ms=slo_ms, floor=floor, top=top, capacity=capacity)
    assert got == best and floor <= got <= top


def test_slo_ceiling_on_resnet50_and_bad_ranges() -> None:
    """ResNet-50's TorchServe profile on 8 cores, SLO 500 ms (the DES's step): batch 32's
    plan takes 361 ms, 64's 668 ms, so the largest within the SLO is 32 (the surge's
    estimate: 128); batch 16's plan serves the most of those (91.5/s backlogged, 32's
    88.6/s), so with capacities the top is 16."""
    from packrat.plan.provision import backlogged_capacity

    table = dict(load_profile(PAPER.parent / "resnet-torchserve.csv").table())
    opt = Optimizer(table, cpus=8, max_batch=128)

    def capacity(batch: int) -> float:
        return backlogged_capacity(table, opt.plan(batch).expand())

    assert slo_ceiling(opt.latency, slo_ms=500.0, floor=4, top=128) == 32
    assert slo_ceiling(opt.latency, slo_ms=500.0, floor=4, top=128, capacity=capacity) == 16
    assert slo_ceiling(opt.latency, slo_ms=10.0, floor=4, top=128) == 4  # none fits: the floor
    with pytest.raises(ValueError):
        slo_ceiling(opt.latency, slo_ms=500.0, floor=8, top=4)
