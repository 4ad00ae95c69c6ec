"""When to switch plans online: pure decision rules over a stream of batch-size observations.

Packrat's online half follows the load: serving pods estimate the batch size their arrivals
form, the operator combines the estimates, and a new plan is adopted only when the change is
sustained, not too soon after the last switch, and worth it by the optimizer's own numbers.
Every rule lives here, free of Kubernetes and clocks (``now`` is an argument), so flapping
and edge cases are tested on synthetic streams.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from packrat.plan.optimizer import Plan, PlanError

LatencyFn = Callable[[int], float]
"""The optimal expected latency for a batch size (``Optimizer.latency``)."""


class Outcome(StrEnum):
    """Decision outcomes, also the label values of the decisions metric."""

    SWITCH = "switch"
    HOLD_SAME = "hold_same"
    HOLD_NOT_SUSTAINED = "hold_not_sustained"
    HOLD_TOO_SOON = "hold_too_soon"
    HOLD_GAIN_TOO_SMALL = "hold_gain_too_small"
    HOLD_NO_DATA = "hold_no_data"
    HOLD_INFEASIBLE = "hold_infeasible"
    HOLD_PINNED = "hold_pinned"


@dataclass(frozen=True, slots=True)
class Policy:
    """The ``autoBatch`` settings of a PackratModel."""

    min_batch: int = 1
    """``autoBatch.min``: the smallest batch size planned for; every observation is clamped
    to ``min_batch..max_batch``."""
    max_batch: int = 64
    """``autoBatch.max``: the largest batch size planned for."""
    sustain: int = 3
    """``autoBatch.sustainObservations``: consecutive equal observations (one per pass)
    needed before a switch."""
    min_interval_s: float = 60.0
    """``autoBatch.minIntervalSeconds``: seconds at least between two automatic switches
    (a manual trigger skips it)."""
    min_gain: float = 0.05
    """``autoBatch.minGain``: the fraction of the expected latency a switch must save
    (0.05: the new plan at least 5% faster than keeping the current one)."""
    batch_delay_ms: float = 0.0
    """The model's ``maxBatchDelayMs``: milliseconds an instance waits for a batch that does
    not fill (what keeping a larger plan costs each batch when the load forms a smaller one)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.max_batch:
            raise ValueError(
                f"need 1 <= min_batch <= max_batch, got {self.min_batch}..{self.max_batch}"
            )
        if self.sustain < 1:
            raise ValueError("sustain must be >= 1")
        if self.min_interval_s < 0 or self.min_gain < 0:
            raise ValueError("min_interval_s and min_gain must be >= 0")
        if not (math.isfinite(self.batch_delay_ms) and self.batch_delay_ms >= 0):
            raise ValueError("batch_delay_ms must be a finite number >= 0")

    def clamp(self, batch: int) -> int:
        return max(self.min_batch, min(self.max_batch, batch))


@dataclass(frozen=True, slots=True)
class Observation:
    """The combined batch-size estimate of all ready pods at ``time`` (seconds)."""

    time: float
    batch: int


@dataclass(frozen=True, slots=True)
class Decision:
    """What one reconfiguration pass decided, and why."""

    outcome: Outcome
    current: int
    """The batch size the current plan is optimised for."""
    target: int | None
    """The batch size weighed: the latest observation or the pin, clamped to the policy's
    range; None before the first observation."""
    expected_gain: float | None
    """The fraction of the expected latency the target's optimal plan saves over keeping the
    current plan (see ``Policy.min_gain``); None when it was not weighed."""
    message: str
    """One sentence for the model's events and status."""

    @property
    def switch(self) -> bool:
        return self.outcome is Outcome.SWITCH


def combine_estimates(estimates: Sequence[int]) -> int | None:
    """Combine per-pod estimates: the mode; ties go to the larger batch (fewer late requests)."""
    valid = [e for e in estimates if e >= 1]
    if not valid:
        return None
    counts = Counter(valid)
    return max(counts, key=lambda b: (counts[b], b))


def slo_ceiling(
    optimal_latency: LatencyFn,
    *,
    slo_ms: float,
    floor: int,
    top: int,
    capacity: Callable[[int], float] | None = None,
) -> int:
    """With a latency objective: the top of autoBatch's range, among the batches in
    ``floor..top`` whose optimal plan is expected within ``slo_ms`` (``floor`` when none is)
    the largest, or with ``capacity`` (queries a second one replica serves backlogged on the
    batch's optimal plan) the one that serves the most (ties to the larger: it serves no
    fewer).

    A batch whose plan alone takes longer than the SLO misses it for every query a full batch
    holds, and a full batch is what a backlog makes; beyond the batch that serves the most, a
    larger one serves fewer and takes longer. In the DES's 4x step (``benchmarks/joint_step.
    py``, ResNet-50 on 8 cores, SLO 500 ms) the estimate during the surge read 128, whose plan
    takes 1585 ms a batch and serves 80.8/s; batch 32's takes 361 ms (88.6/s), batch 16's
    175 ms (91.5/s): the top is 16. Batches whose plan is infeasible count as over the SLO.
    Linear in the range (the optimizer's latencies and plans are lookups).
    """
    if not 1 <= floor <= top:
        raise ValueError(f"need 1 <= floor <= top, got {floor}..{top}")
    fits = []
    for batch in range(floor, top + 1):
        try:
            if optimal_latency(batch) <= slo_ms:
                fits.append(batch)
        except PlanError:
            continue
    if not fits:
        return floor
    if capacity is None:
        return fits[-1]
    return max(fits, key=lambda b: (capacity(b), b))


def plan_latency_at(plan: Plan, table: Mapping[tuple[int, int], float], batch: int) -> float:
    """Expected latency of keeping ``plan`` when ``batch`` requests arrive together.

    The dispatcher spreads requests in proportion to each instance's batch size; an instance
    given more than its batch runs several rounds, one given fewer runs a smaller batch,
    costed at the smallest profiled batch that holds it (conservative).
    """
    if batch <= 0:
        raise PlanError(f"batch must be positive, got {batch}")
    worst = 0.0
    for group in plan.instances:
        share = batch * group.batch / plan.capacity  # a padded plan holds more than its batch
        rounds = max(1, math.ceil(share / group.batch - 1e-9))
        per_round = math.ceil(share / rounds - 1e-9)
        profiled = sorted(b for (t, b) in table if t == group.threads and b >= per_round)
        if profiled:
            latency = table[(group.threads, profiled[0])]
        else:  # larger than any profiled batch of this width: scale the largest linearly
            largest = max(b for (t, b) in table if t == group.threads)
            latency = table[(group.threads, largest)] * per_round / largest
        worst = max(worst, rounds * latency)
    return worst


def decide(
    *,
    policy: Policy,
    current_plan: Plan,
    table: Mapping[tuple[int, int], float],
    optimal_latency: LatencyFn,
    history: Sequence[Observation],
    last_switch_at: float | None,
    now: float,
    pinned: int | None = None,
    ignore_interval: bool = False,
) -> Decision:
    """Decide whether to switch from ``current_plan`` given the recent observations.

    Rules, in order: a target needs ``sustain`` consecutive equal observations (clamped to
    the policy's range); it must differ from the current batch; at least ``min_interval_s``
    must have passed since the last switch; and the optimal plan at the target must be
    expected faster than keeping the current plan at the target by more than ``min_gain``.

    Overrides: ``pinned`` (an operator-given batch, clamped to the range) replaces every rule
    but feasibility: switch to it once, then hold. ``ignore_interval`` (a manual trigger)
    skips the minimum interval only; sustain and gain still apply.
    """
    weighing = _Weighing(current_plan, table, optimal_latency)
    if pinned is not None:
        return _decide_pinned(policy, weighing, pinned=pinned)
    held = _hold_by_rules(
        policy,
        current_plan.batch,
        history,
        last_switch_at=last_switch_at,
        now=now,
        ignore_interval=ignore_interval,
    )
    if isinstance(held, Decision):
        return held
    return _decide_by_gain(policy, weighing, target=held)


def _hold_by_rules(
    policy: Policy,
    current: int,
    history: Sequence[Observation],
    *,
    last_switch_at: float | None,
    now: float,
    ignore_interval: bool,
) -> Decision | int:
    """The rules before the gain, in order: a hold, or the sustained target to weigh."""
    if not history:
        return Decision(Outcome.HOLD_NO_DATA, current, None, None, "no observations yet")
    recent = [policy.clamp(o.batch) for o in history[-policy.sustain :]]
    target = recent[-1]
    if len(recent) < policy.sustain or any(b != target for b in recent):
        return Decision(
            Outcome.HOLD_NOT_SUSTAINED,
            current,
            target,
            None,
            f"batch {target} seen in {sum(b == target for b in recent)} of the last "
            f"{policy.sustain} observations",
        )
    if target == current:
        return Decision(
            Outcome.HOLD_SAME, current, target, None, f"load still fits batch {current}"
        )
    if (
        not ignore_interval
        and last_switch_at is not None
        and now - last_switch_at < policy.min_interval_s
    ):
        wait = policy.min_interval_s - (now - last_switch_at)
        return Decision(
            Outcome.HOLD_TOO_SOON,
            current,
            target,
            None,
            f"last switch {now - last_switch_at:.0f}s ago; next allowed in {wait:.0f}s",
        )
    return target


@dataclass(frozen=True, slots=True)
class _Weighing:
    """What a switch to a target batch is weighed on: the optimal plan's latency at the
    target against keeping ``current_plan`` at it (costed on the profile's ``table``)."""

    current_plan: Plan
    table: Mapping[tuple[int, int], float]
    optimal_latency: LatencyFn

    def latencies(self, target: int, *, keep_extra_ms: float = 0.0) -> tuple[float, float, float]:
        """(the optimal plan's latency, keeping the current plan's plus ``keep_extra_ms``, the
        gain: the fraction of the latter saved); raises ``PlanError`` when ``target`` has no
        feasible plan."""
        new_latency = self.optimal_latency(target)
        keep_latency = plan_latency_at(self.current_plan, self.table, target) + keep_extra_ms
        return new_latency, keep_latency, (keep_latency - new_latency) / keep_latency


def _decide_by_gain(policy: Policy, weighing: _Weighing, *, target: int) -> Decision:
    """Switch to ``target`` when its optimal plan is expected faster than keeping the
    current plan at ``target`` by more than ``min_gain``.

    Keeping a larger plan when the load forms a smaller batch costs its instances' batch
    delay too: no instance's batch fills (each gets its share of ``target``), so each waits
    ``policy.batch_delay_ms`` before it runs. Without it, a switch down looked no faster
    whenever the current instances can run the smaller batch (measured on real pods: 93% of
    a pod's batches left on their timeout and every move down was vetoed at 0.0%).
    """
    current = weighing.current_plan.batch
    delay_ms = policy.batch_delay_ms if target < current else 0.0
    try:
        new_latency, keep_latency, gain = weighing.latencies(target, keep_extra_ms=delay_ms)
    except PlanError as exc:
        return Decision(Outcome.HOLD_INFEASIBLE, current, target, None, str(exc))
    if gain <= policy.min_gain:
        return Decision(
            Outcome.HOLD_GAIN_TOO_SMALL,
            current,
            target,
            gain,
            f"plan for batch {target} expected {gain:.1%} faster than keeping the current plan "
            f"(threshold {policy.min_gain:.0%})",
        )
    return Decision(
        Outcome.SWITCH,
        current,
        target,
        gain,
        f"batch {current} -> {target}: expected {new_latency:.1f} ms vs {keep_latency:.1f} ms "
        f"keeping the current plan ({gain:.1%} faster)",
    )


def _decide_pinned(policy: Policy, weighing: _Weighing, *, pinned: int) -> Decision:
    current = weighing.current_plan.batch
    target = policy.clamp(pinned)
    note = (
        ""
        if target == pinned
        else f" (pin {pinned} clamped to {policy.min_batch}..{policy.max_batch})"
    )
    if target == current:
        return Decision(
            Outcome.HOLD_PINNED, current, target, None, f"pinned at batch {target}{note}"
        )
    try:
        new_latency, keep_latency, gain = weighing.latencies(target)
    except PlanError as exc:
        return Decision(Outcome.HOLD_INFEASIBLE, current, target, None, f"pin: {exc}")
    return Decision(
        Outcome.SWITCH,
        current,
        target,
        gain,
        f"batch {current} -> {target}: pinned by annotation{note}; expected {new_latency:.1f} ms "
        f"vs {keep_latency:.1f} ms keeping the current plan",
    )


# -- the fast trigger: reacting within seconds, without flapping ---------------------------------
class Fast(StrEnum):
    """Why the fast trigger fired (or did not), also a status value."""

    SUSTAINED = "sustained"  # the pods' estimate has held a new value for ``sustain_s``
    TIMEOUTS = "timeouts"  # most batches left on their delay timeout: the batch is too large
    NONE = "none"


@dataclass(frozen=True, slots=True)
class FastPolicy:
    """When to decide at once rather than after ``Policy.sustain`` observations and
    ``Policy.min_interval_s`` (the Packrat paper reacts on a 1 s timeout and on frequent batch
    timeouts)."""

    sustain_s: float = 1.0
    """Seconds the pods' estimate must have held its value (0 disables the fast trigger)."""
    near_hold: float = 2.0
    """``sustain_s`` times this for a neighbouring batch (within a factor of 2 of the current:
    the next power of two up or down, which is what noise on a steady load reads as; in the
    DES's steady 50/s, ``benchmarks/tuner/joint_step.py``, such blips held up to 1.0 s and each
    one cost a switch there and back)."""
    min_interval_s: float = 5.0
    """Seconds at least between two fast switches."""
    timeout_high: float = 0.5
    """The fraction of batches left on their delay timeout that fires the trigger."""
    timeout_low: float = 0.2
    """The fraction it must fall below before it can fire again (hysteresis)."""
    min_batches: int = 20
    """Batches at least behind a timeout fraction: one over fewer is no evidence."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sustain_s) and self.sustain_s >= 0):
            raise ValueError("sustain_s must be a finite number >= 0")
        if not (math.isfinite(self.near_hold) and self.near_hold >= 1):
            raise ValueError("near_hold must be a finite number >= 1")
        if not (math.isfinite(self.min_interval_s) and self.min_interval_s >= 0):
            raise ValueError("min_interval_s must be a finite number >= 0")
        if not 0 <= self.timeout_low < self.timeout_high <= 1:
            raise ValueError("need 0 <= timeout_low < timeout_high <= 1")
        if self.min_batches < 1:
            raise ValueError("min_batches must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.sustain_s > 0

    def hold_s(self, current: int, target: int) -> float:
        """How long an estimate of ``target`` must have held to move from ``current``."""
        near = max(current, target) <= 2 * min(current, target)
        return self.sustain_s * (self.near_hold if near else 1.0)


@dataclass(frozen=True, slots=True)
class FastState:
    """What the fast trigger remembers between looks (kept in status by the caller).

    ``armed``: the timeout trigger may fire (it disarms when it fires and re-arms once the
    timeout fraction falls to ``timeout_low``). ``last_at`` / ``last_from``: when the last
    switch (fast or not) happened and the batch it left.
    """

    armed: bool = True
    last_at: float | None = None
    last_from: int | None = None


@dataclass(frozen=True, slots=True)
class FastLook:
    """One look at the pods: their combined estimate, how long every pod's estimate has held
    (the smallest), and the fraction of batches that left on timeout since the last evidence
    (None: too few batches, or the runtime does not count them)."""

    observed: int
    stable_s: float | None
    timeout_fraction: float | None


@dataclass(frozen=True, slots=True)
class FastVerdict:
    reason: Fast
    state: FastState
    message: str

    @property
    def fire(self) -> bool:
        return self.reason is not Fast.NONE


def fast_trigger(
    *,
    fast: FastPolicy,
    policy: Policy,
    current: int,
    look: FastLook,
    state: FastState,
    now: float,
) -> FastVerdict:
    """Whether to decide at once on ``look`` (the caller then runs :func:`decide` on this one
    observation, ignoring the interval: the gain rule still applies).

    Fires on a sustained change (an estimate other than ``current``, held by every pod for
    ``sustain_s``, or ``near_hold`` times that for a neighbouring batch: :meth:`FastPolicy.
    hold_s`) or on frequent batch timeouts (at least ``timeout_high`` of the batches,
    with a smaller estimate to move to), and never:
    - within ``fast.min_interval_s`` of the last switch;
    - back to the batch the last switch left within ``policy.min_interval_s`` (a reversal
      waits for the slow rules: the hysteresis that stops A -> B -> A flapping);
    - on timeouts again before their fraction has fallen to ``timeout_low`` (re-arming).
    """
    target = policy.clamp(look.observed)
    fraction = look.timeout_fraction
    armed = state.armed or (fraction is not None and fraction <= fast.timeout_low)
    kept = FastState(armed=armed, last_at=state.last_at, last_from=state.last_from)
    if not fast.enabled or target == current:
        return FastVerdict(Fast.NONE, kept, "")
    since = None if state.last_at is None else now - state.last_at
    if since is not None and since < fast.min_interval_s:
        return FastVerdict(Fast.NONE, kept, f"last switch {since:.1f}s ago")
    if target == state.last_from and since is not None and since < policy.min_interval_s:
        return FastVerdict(Fast.NONE, kept, f"batch {target} was left {since:.0f}s ago")
    reason = Fast.NONE
    if look.stable_s is not None and look.stable_s >= fast.hold_s(current, target):
        reason = Fast.SUSTAINED
        message = f"estimate {target} held {look.stable_s:.1f}s on every pod"
    elif armed and fraction is not None and fraction >= fast.timeout_high and target < current:
        reason = Fast.TIMEOUTS
        message = f"{fraction:.0%} of batches left on their delay timeout"
    if reason is Fast.NONE:
        return FastVerdict(Fast.NONE, kept, "")
    fired = FastState(
        armed=armed and reason is not Fast.TIMEOUTS,
        last_at=state.last_at,
        last_from=state.last_from,
    )
    return FastVerdict(reason, fired, message)


def fast_due(
    *,
    fast: FastPolicy,
    policy: Policy,
    current: int,
    look: FastLook,
    state: FastState | None = None,
    now: float = 0.0,
) -> float | None:
    """Seconds until :func:`fast_trigger` could fire on ``look``'s estimate, when it is one
    the trigger would move to (clamped to ``policy``'s range, not ``current``) and it cannot
    yet; None when it can now or never will on this estimate.

    What it waits for: the estimate to have held ``fast.hold_s`` on every pod, and
    (``state``, at ``now``) the fast switches' spacing and the reversal's hold after the
    last switch. The caller looks again then, not a whole read interval (or an estimate
    interval) later.
    """
    target = policy.clamp(look.observed)
    if not fast.enabled or look.stable_s is None or target == current:
        return None
    waits = [fast.hold_s(current, target) - look.stable_s]
    if state is not None and state.last_at is not None:
        waits.append(state.last_at + fast.min_interval_s - now)
        if target == state.last_from:
            waits.append(state.last_at + policy.min_interval_s - now)
    remaining = max(waits)
    return remaining if remaining > 0 else None


def timeout_fraction(
    baseline: tuple[int, int] | None, totals: tuple[int, int], *, min_batches: int
) -> tuple[float | None, tuple[int, int]]:
    """The fraction of batches that left on timeout between ``baseline`` and ``totals``
    (cumulative (full, timeout) counts summed over the pods), and the baseline to keep.

    Counts that went down (a pod restarted or left) restart the baseline; a fraction over
    fewer than ``min_batches`` is None and the baseline is kept, so evidence accumulates.
    """
    if baseline is None or totals[0] < baseline[0] or totals[1] < baseline[1]:
        return None, totals
    full, timeout = totals[0] - baseline[0], totals[1] - baseline[1]
    if full + timeout < min_batches:
        return None, baseline
    return timeout / (full + timeout), totals
