"""autoBatch glue: the serving pods' batch-size estimates in, ``status.batchSize`` out.

The decision rules (sustain, minimum interval, expected gain, clamping, pinning) live in the
pure ``packrat.plan.reconfig``; this module only translates between Kubernetes and those
rules: the ``spec.autoBatch`` policy, the override annotations, the observation history kept
in ``status.batchSize`` (all state lives in status, so a restarted operator carries on), a
cache of optimizers (the DP runs once per profile, cpus and maximum batch), and parsing
the estimate a serving pod reports (``estimates`` reads them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packrat.controller.core.cache import Lru
from packrat.controller.core.model import AutoBatch
from packrat.controller.core.status import BatchRecord, FastRecord, parse_time
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import Profile
from packrat.plan.reconfig import (
    Decision,
    FastLook,
    FastPolicy,
    FastState,
    FastVerdict,
    Observation,
    Policy,
    combine_estimates,
    fast_trigger,
    timeout_fraction,
)

logger = logging.getLogger(__name__)

PIN_ANNOTATION = "packrat.dev/pin-batch"
"""``"N"``: switch to batch N once (clamped to the autoBatch range), then hold there."""
RECONFIGURE_ANNOTATION = "packrat.dev/reconfigure"
"""Any new value: decide at once, ignoring ``minIntervalSeconds`` (sustain and gain apply)."""
HISTORY_LIMIT = 10
"""Switches kept in ``status.switchHistory``."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One round of estimates: one per ready pod, and where they came from; with the fast
    trigger's evidence when every pod gave it: how long the pods' estimates have held (the
    smallest) and their batches' (full, timeout) counts (summed)."""

    estimates: tuple[int, ...]
    source: str  # "pods" (each ready pod's /status) or "service" (one pod, via the Service)
    stable_s: float | None = None
    batches: tuple[int, int] | None = None

    @property
    def combined(self) -> int | None:
        return combine_estimates(self.estimates)


EstimateSource = Callable[[str, str], "Reading | int | Sequence[int] | None"]
"""(namespace, name) -> the serving pods' batch-size estimates."""


def as_reading(value: Reading | int | Sequence[int] | None) -> Reading | None:
    """Normalise what an estimate source returns (a plain int counts as one Service read)."""
    if value is None or isinstance(value, Reading):
        return value
    if isinstance(value, int):
        return Reading((value,), "service")
    return Reading(tuple(int(v) for v in value), "pods")


def policy_from_spec(auto: AutoBatch, *, batch_delay_ms: float = 0.0) -> Policy:
    """The decision policy of a model's ``spec.autoBatch`` (``batch_delay_ms``: its
    ``maxBatchDelayMs``, which a plan larger than the load waits on every batch)."""
    return Policy(
        min_batch=auto.min,
        max_batch=auto.max,
        sustain=auto.sustain_observations,
        min_interval_s=auto.min_interval_seconds,
        min_gain=auto.min_gain,
        batch_delay_ms=batch_delay_ms,
    )


def fast_policy_from_spec(auto: AutoBatch) -> FastPolicy:
    """The fast trigger of a model's ``spec.autoBatch`` (off at ``sustainSeconds`` 0)."""
    return FastPolicy(sustain_s=auto.sustain_seconds)


def fast_look(
    batch_status: BatchRecord,
    *,
    reading: Reading,
    fast: FastPolicy,
    policy: Policy,
    current: int,
    last_switch_at: float | None,
    now: float,
) -> tuple[FastVerdict, BatchRecord]:
    """The fast trigger on this round's reading, and ``status.batchSize`` with its state
    (``fast``: armed, the batch counts' baseline, the last timeout fraction, the batch the
    last switch left and when it was decided)."""
    kept = batch_status.fast or FastRecord()
    baseline = kept.baseline
    fraction, baseline = (
        timeout_fraction(baseline, reading.batches, min_batches=fast.min_batches)
        if reading.batches is not None
        else (None, baseline)
    )
    last_at = max([t for t in (last_switch_at, kept.decided_at) if t is not None], default=None)
    state = FastState(
        armed=kept.armed,
        last_at=float(last_at) if last_at is not None else None,
        last_from=kept.last_from,
    )
    combined = reading.combined
    assert combined is not None
    look = FastLook(observed=combined, stable_s=reading.stable_s, timeout_fraction=fraction)
    verdict = fast_trigger(
        fast=fast, policy=policy, current=current, look=look, state=state, now=now
    )
    saved = replace(
        kept,
        armed=verdict.state.armed,
        baseline=baseline if baseline is not None else kept.baseline,
        timeout_fraction=round(fraction, 4) if fraction is not None else kept.timeout_fraction,
    )
    return verdict, replace(batch_status, fast=saved)


def peek_wake(basis: Reading, now: Reading | None, fast: FastPolicy) -> tuple[str, str] | None:
    """Why a look at the pods between two passes (the fast trigger's reads: the pods the
    last pass read, no API call) calls for a pass now, as (``"pods"``, ``"estimate"`` or
    ``"timeouts"``, a message); None when it does not.

    ``basis`` is what the last pass read. A pass is due when a pod gave no estimate or the
    pods changed (the pass lists them again), when the combined estimate differs from the
    pass's (the pass records it and, not held long enough yet, looks again when it will have
    been), and when at least ``fast.timeout_high`` of ``fast.min_batches`` or more batches
    since that pass left on their timeout. Steady pods never wake a pass: a pass runs at the
    operator's estimate interval, however often the pods are read.
    """
    if now is None or len(now.estimates) != len(basis.estimates):
        return "pods", "the pods changed"
    if now.combined != basis.combined:
        return "estimate", f"estimate {basis.combined} -> {now.combined}"
    if now.batches is None or basis.batches is None:
        return None
    full, timeout = now.batches[0] - basis.batches[0], now.batches[1] - basis.batches[1]
    if full < 0 or timeout < 0:
        return "pods", "the pods' batch counts restarted"
    fraction, _ = timeout_fraction(basis.batches, now.batches, min_batches=fast.min_batches)
    if fraction is not None and fraction >= fast.timeout_high:
        return "timeouts", f"{timeout} of {full + timeout} batches left on their timeout"
    return None


def fast_switched(batch_status: BatchRecord, *, left: int, now: float) -> BatchRecord:
    """``status.batchSize`` remembering a decided switch for the fast trigger's hysteresis."""
    kept = batch_status.fast or FastRecord()
    return replace(batch_status, fast=replace(kept, last_from=left, decided_at=now))


def parse_pin(annotations: Mapping[str, str] | None) -> tuple[int | None, str | None]:
    """The pinned batch from the annotation, or (None, why it is unusable)."""
    raw = (annotations or {}).get(PIN_ANNOTATION)
    if raw is None or not str(raw).strip():
        return None, None
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None, f"annotation {PIN_ANNOTATION}={raw!r} is not an integer; ignored"
    if value < 1:
        return None, f"annotation {PIN_ANNOTATION}={raw!r} must be >= 1; ignored"
    return value, None


def pending_trigger(annotations: Mapping[str, str] | None, batch_status: BatchRecord) -> str | None:
    """The reconfigure annotation's value when it has not been acted on yet."""
    value = (annotations or {}).get(RECONFIGURE_ANNOTATION)
    if value is None or value == batch_status.reconfigure_handled:
        return None
    return str(value)


def record_observation(
    batch_status: BatchRecord, *, reading: Reading, policy: Policy, now: str
) -> BatchRecord:
    """``status.batchSize`` with one more observation: the pods' combined estimate clamped to
    the policy's range (``observed``; the raw per-pod values in ``estimates``), and the last
    ``sustain`` observations (``recent``)."""
    if reading.combined is None:
        return batch_status
    combined = policy.clamp(reading.combined)
    return replace(
        batch_status,
        recent=(*batch_status.recent, (combined, now))[-policy.sustain :],
        observed=combined,
        observed_at=now,
        estimates=tuple(reading.estimates),
        source=reading.source,
    )


def observations(batch_status: BatchRecord) -> list[Observation]:
    """The stored observation history, oldest first, as the decision rules take it."""
    out = []
    for batch, time in batch_status.recent:
        when = parse_time(time)
        if when is not None:
            out.append(Observation(time=when.timestamp(), batch=batch))
    return out


def decision_status(decision: Decision, *, now: str, trigger: str | None) -> dict[str, Any]:
    """``status.batchSize.lastDecision``: what was decided, when and why."""
    out: dict[str, Any] = {
        "time": now,
        "outcome": decision.outcome.value,
        "message": decision.message,
    }
    if decision.target is not None:
        out["target"] = decision.target
    if decision.expected_gain is not None:
        out["expectedGain"] = round(decision.expected_gain, 4)
    if trigger is not None:
        out["trigger"] = f"{RECONFIGURE_ANNOTATION}={trigger}"
    return out


def record_decision(
    batch_status: BatchRecord,
    decision: Decision,
    *,
    now: str,
    trigger: str | None,
    pin_error: str | None = None,
    fast_note: str | None = None,
) -> tuple[BatchRecord, str | None]:
    """``status.batchSize`` with this pass's decision (``lastDecision``, the trigger handled,
    the new ``target`` when it switches), and the previous decision's outcome."""
    last = decision_status(decision, now=now, trigger=trigger)
    if pin_error:
        last["message"] += f" ({pin_error})"
    if fast_note is not None:
        last["fast"] = fast_note
    switching = decision.switch and decision.target is not None
    out = replace(
        batch_status,
        last_decision=last,
        reconfigure_handled=trigger if trigger is not None else batch_status.reconfigure_handled,
        target=decision.target if switching else batch_status.target,
    )
    return out, batch_status.last_outcome


def observed(batch_status: BatchRecord) -> int | None:
    """The last combined observation (``observed``), if any."""
    return batch_status.observed


def append_history(
    history: Sequence[Mapping[str, Any]] | None,
    entry: Mapping[str, Any],
    *,
    limit: int = HISTORY_LIMIT,
) -> list[dict[str, Any]]:
    """The bounded switch history with ``entry`` appended (oldest dropped first)."""
    out = [dict(h) for h in history or []]
    out.append(dict(entry))
    return out[-limit:]


class OptimizerCache(Lru[tuple[str, int, int], Optimizer]):
    """Optimizers by (profile digest, cpus, max batch): the DP is solved once per key."""

    def optimizer(self, profile: Profile, *, digest: str, cpus: int, max_batch: int) -> Optimizer:
        return self.get_or_make(
            (digest, cpus, max_batch),
            lambda: Optimizer.for_profile(profile, cpus=cpus, max_batch=max_batch),
        )


# -- reading the estimates (I/O) ---------------------------------------------------------------
MAX_ESTIMATE = 1 << 16
"""The largest batch-size estimate taken from a pod (queue depths beyond are not batches)."""


def parse_estimate(doc: Any) -> int | None:
    """The batch-size estimate in a serving pod's ``/status`` document, validated like user
    input: an integer (or an integral number) in 1..``MAX_ESTIMATE``, else None."""
    section = doc.get("batch_size_estimate") if isinstance(doc, Mapping) else None
    value = section.get("estimate") if isinstance(section, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (value.is_integer() and abs(value) <= MAX_ESTIMATE):
        return None
    number = int(value)
    return number if 1 <= number <= MAX_ESTIMATE else None


MAX_STABLE_SECONDS = 1e7
MAX_BATCH_COUNT = 1 << 53
"""Bounds on what a pod may report (beyond them the value is no evidence)."""


@dataclass(frozen=True, slots=True)
class PodEstimate:
    """One pod's ``/status`` estimate section, validated."""

    estimate: int
    stable_s: float | None
    batches: tuple[int, int] | None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_BATCH_COUNT else None


def parse_pod_estimate(doc: Any) -> PodEstimate | None:
    """The estimate (:func:`parse_estimate`), and when valid the seconds it has held (a
    finite number in 0..``MAX_STABLE_SECONDS``) and the batch counts (``{"full": n,
    "timeout": m}``, integers in 0..2^53); an invalid extra is absent, not an error."""
    estimate = parse_estimate(doc)
    if estimate is None:
        return None
    section = doc["batch_size_estimate"]
    stable = section.get("stable_seconds")
    stable_s = (
        float(stable)
        if isinstance(stable, int | float)
        and not isinstance(stable, bool)
        and 0 <= stable <= MAX_STABLE_SECONDS  # NaN fails both comparisons
        else None
    )
    counts = section.get("batches")
    full = _count(counts.get("full")) if isinstance(counts, Mapping) else None
    timeout = _count(counts.get("timeout")) if isinstance(counts, Mapping) else None
    batches = (full, timeout) if full is not None and timeout is not None else None
    return PodEstimate(estimate, stable_s, batches)


def reading_of(pods: Sequence[PodEstimate], source: str) -> Reading | None:
    """One round's :class:`Reading`; the fast trigger's evidence only when every pod gave it."""
    if not pods:
        return None
    stables = [p.stable_s for p in pods]
    counts = [p.batches for p in pods]
    return Reading(
        tuple(p.estimate for p in pods),
        source,
        stable_s=None if None in stables else min(s for s in stables if s is not None),
        batches=(
            None
            if None in counts
            else (sum(c[0] for c in counts if c), sum(c[1] for c in counts if c))
        ),
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not terminating, Ready condition True, with an IP."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
