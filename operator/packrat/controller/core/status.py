"""Pure status logic: the phase machine, standard Kubernetes conditions and the typed records
of the status's parts (a switch, a profile, the batch record, the provisioning, the
tuner's state, a canary), converted once, here.

Phases and conditions are what users and tools read (``kubectl get prm``, ``kubectl wait
--for=condition=Ready``), so their rules live here, free of I/O and unit-tested:
``lastTransitionTime`` moves only when a condition's status flips.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packrat.controller.core.model import ModelSpec, stored
from packrat.controller.core.plans import from_status, to_status
from packrat.plan.optimizer import Plan

PHASES = ("Pending", "Profiling", "Planning", "Deploying", "Ready", "Reconfiguring", "Failed")
CONDITION_TYPES = ("Profiled", "Planned", "Ready", "Reconfiguring", "Degraded")


def now_iso(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new conditions list with ``type_`` set; other conditions are kept as they are.

    ``lastTransitionTime`` is kept when the status does not change (reason and message may).
    """
    value = status if isinstance(status, str) else ("True" if status else "False")
    if value not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown, got {value!r}")
    stamp = now or now_iso()
    out = [dict(cond) for cond in conditions or () if cond.get("type") != type_]
    old = get_condition(conditions, type_)
    new: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
    }
    if old is not None and old.get("status") == value:
        new["lastTransitionTime"] = old.get("lastTransitionTime", stamp)
    if generation is not None:
        new["observedGeneration"] = generation
    if old is None:
        out.append(new)
    else:  # in the old one's place
        at = next(i for i, c in enumerate(conditions or ()) if c.get("type") == type_)
        out.insert(at, new)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(str(c.get("type")), len(order)))


def get_condition(
    conditions: Sequence[Mapping[str, Any]] | None, type_: str
) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return bool(cond and cond.get("status") == "True")


@dataclass(frozen=True)
class Facts:
    """What one reconcile pass found; the phase follows from it."""

    invalid: bool = False
    failed: bool = False
    profiled: bool = False
    profiling: bool = False
    planned: bool = False
    deployed: bool = False
    ready_replicas: int = 0
    replicas: int = 1
    switching: bool = False


def derive_phase(facts: Facts) -> str:
    """The phase machine: Pending -> Profiling -> Planning -> Deploying -> Ready, with
    Reconfiguring during a slot switch and Failed for invalid specs and exhausted retries."""
    if facts.invalid or facts.failed:
        return "Failed"
    if not facts.profiled:
        return "Profiling" if facts.profiling else "Pending"
    if not facts.planned or not facts.deployed:
        return "Planning" if not facts.planned else "Deploying"
    if facts.switching:
        return "Reconfiguring"
    if facts.ready_replicas >= facts.replicas:
        return "Ready"
    return "Deploying"


@dataclass(frozen=True)
class PipelineFacts:
    """What one pipeline pass found; the pipeline's phase follows from it."""

    failed: bool = False
    serving: bool = False
    missing_profiles: bool = True


def derive_pipeline_phase(facts: PipelineFacts) -> str:
    """The pipeline's phase machine: Pending (stage profiles missing) -> Provisioning
    (stages and router deploying) -> Serving, and Failed."""
    if facts.failed:
        return "Failed"
    if facts.serving:
        return "Serving"
    return "Pending" if facts.missing_profiles else "Provisioning"


# -- the typed records of a model's status ------------------------------------------------
# ``status.switch`` and ``status.profile`` are converted here, at the status edge, as plans are
# (:mod:`packrat.controller.core.plans`): steps read attributes and call the record's steps,
# never string keys. ``status.switch`` moves through its stages in one direction::
#
#     rollout --moved--> draining --(done: removed)
#        \--aborted--> aborted --(spec changed, or served: removed)
#
# A record keeps what it was read from (``extra``) so fields this operator does not know (a
# newer one's) survive a pass.


class Stage(enum.StrEnum):
    """Where a Deployment switch is: the passive slot rolling out, the Service moved and the
    old slot draining, or given up (kept so the same spec is not tried again)."""

    ROLLOUT = "rollout"
    DRAINING = "draining"
    ABORTED = "aborted"


# the status form's keys, in the order they are written
_KEYS = (
    ("stage", "stage"),
    ("from_slot", "fromSlot"),
    ("target_slot", "targetSlot"),
    ("hash", "hash"),
    ("spec", "spec"),
    ("reason", "reason"),
    ("started_at", "startedAt"),
    ("ready_seconds", "readySeconds"),
    ("switched_seconds", "switchedSeconds"),
    ("drain_until", "drainUntil"),
)


@dataclass(frozen=True)
class Switch:
    """``status.switch``: a Deployment switch under way or given up."""

    stage: Stage
    target_slot: str
    from_slot: str | None = None
    hash: str | None = None
    spec: Mapping[str, Any] | None = None  # the spec switched to, in its stored form
    reason: str = ""
    started_at: str | None = None
    ready_seconds: float | None = None
    switched_seconds: float | None = None
    drain_until: str | None = None
    plan: Plan | None = None  # the plan switched to
    extra: Mapping[str, Any] = field(default_factory=dict)  # unknown keys, kept as read

    # -- the steps ---------------------------------------------------------------------------
    @classmethod
    def rollout(
        cls,
        *,
        from_slot: str,
        target_slot: str,
        serving_hash: str,
        spec: Mapping[str, Any],
        reason: str,
        started_at: str,
        plan: Plan,
    ) -> Switch:
        """A switch started: ``target_slot`` rolls ``spec`` and ``plan`` out."""
        stage, spec = Stage.ROLLOUT, dict(spec)  # (the fields in their order)
        return cls(stage, target_slot, from_slot, serving_hash, spec, reason, started_at, plan=plan)

    def moved(self, *, ready_seconds: float, switched_seconds: float, drain_until: str) -> Switch:
        """The target slot ready and the Service moved to it: the old slot drains."""
        assert self.stage is Stage.ROLLOUT, self.stage
        return replace(
            self,
            stage=Stage.DRAINING,
            ready_seconds=ready_seconds,
            switched_seconds=switched_seconds,
            drain_until=drain_until,
        )

    def aborted(self, reason: str) -> Switch:
        """Given up: only what keeps the same spec from being tried again stays."""
        return Switch(
            stage=Stage.ABORTED, hash=self.hash, target_slot=self.target_slot, reason=reason
        )

    # -- questions ---------------------------------------------------------------------------
    @property
    def under_way(self) -> bool:
        """A rollout or a drain (not a switch given up)."""
        return self.stage is not Stage.ABORTED

    def gave_up_on(self, serving_hash: str) -> bool:
        """Whether this is an aborted switch to ``serving_hash`` (not to be tried again)."""
        return self.stage is Stage.ABORTED and self.hash == serving_hash

    @property
    def plan_label(self) -> str:
        return self.plan.label if self.plan is not None else ""

    @property
    def plan_batch(self) -> int | None:
        return self.plan.batch if self.plan is not None else None

    # -- the status edge ---------------------------------------------------------------------
    @classmethod
    def from_status(cls, doc: Any) -> Switch | None:
        """The record ``status.switch`` holds (None when it holds none, or no known stage)."""
        if not isinstance(doc, Mapping) or not doc:
            return None
        try:
            stage = Stage(str(doc.get("stage")))
        except ValueError:
            return None
        spec = doc.get("spec")
        return cls(
            stage=stage,
            from_slot=_opt_str(doc.get("fromSlot")),
            target_slot=str(doc.get("targetSlot", "")),
            hash=_opt_str(doc.get("hash")),
            spec=dict(spec) if isinstance(spec, Mapping) else None,
            reason=str(doc.get("reason", "")),
            started_at=_opt_str(doc.get("startedAt")),
            ready_seconds=_opt_float(doc.get("readySeconds")),
            switched_seconds=_opt_float(doc.get("switchedSeconds")),
            drain_until=_opt_str(doc.get("drainUntil")),
            plan=from_status(doc.get("plan")),
            extra=_unknown(doc, _KEYS, "plan"),
        )

    def to_status(self) -> dict[str, Any]:
        """The status form (fields not set are left out)."""
        out = _written(self, _KEYS, self.extra)
        if self.plan is not None:
            out["plan"] = to_status(self.plan)
        return out


def _unknown(doc: Mapping[str, Any], keys: Sequence[tuple[str, str]], *more: str) -> dict[str, Any]:
    """What ``doc`` holds besides the record's ``keys`` (attribute, status key) and ``more``
    (a newer operator's fields, kept as read)."""
    known = {camel for _, camel in keys} | set(more)
    return {k: copy.deepcopy(v) for k, v in doc.items() if k not in known}


def _written(
    record: Any, keys: Sequence[tuple[str, str]], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """A record's status form: ``extra`` (kept as read), then each of its ``keys``
    (attribute, status key) that is set, in their order (an enum as its value)."""
    out: dict[str, Any] = copy.deepcopy(dict(extra))
    for attr, camel in keys:
        if (value := getattr(record, attr)) is None:
            continue
        out[camel] = value.value if isinstance(value, enum.Enum) else copy.deepcopy(value)
    return out


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class FastRecord:
    """``status.batchSize.fast``: the fast trigger's state between passes (armed, the pods'
    batch counts it measures timeouts from, the last timeout fraction, the batch the last
    decided switch left and when it was decided, in epoch seconds)."""

    armed: bool = True
    baseline: tuple[int, int] | None = None
    timeout_fraction: float | None = None
    last_from: int | None = None
    decided_at: float | None = None

    @classmethod
    def from_status(cls, doc: Any) -> FastRecord | None:
        if not isinstance(doc, Mapping):
            return None
        base = doc.get("baseline")
        counts = [_opt_int(v) for v in base] if isinstance(base, list) and len(base) == 2 else []
        return cls(
            armed=doc.get("armed") is not False,
            baseline=(counts[0], counts[1])
            if len(counts) == 2
            and counts[0] is not None
            and counts[1] is not None
            and min(counts[0], counts[1]) >= 0
            else None,
            timeout_fraction=_opt_float(doc.get("timeoutFraction")),
            last_from=_opt_int(doc.get("lastFrom")),
            decided_at=_opt_float(doc.get("decidedAt")),
        )

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"armed": self.armed}
        if self.baseline is not None:
            out["baseline"] = list(self.baseline)
        if self.timeout_fraction is not None:
            out["timeoutFraction"] = self.timeout_fraction
        if self.last_from is not None:
            out["lastFrom"] = self.last_from
        if self.decided_at is not None:
            out["decidedAt"] = self.decided_at
        return out


# BatchRecord's plain fields: (attribute, status key, how it is read back)
_BATCH_SCALARS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("current", "current", _opt_int),
    ("target", "target", _opt_int),
    ("observed", "observed", _opt_int),
    ("observed_at", "observedAt", _opt_str),
    ("source", "source", _opt_str),
    ("reconfigure_handled", "reconfigureHandled", _opt_str),
)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """``status.batchSize``, typed: the batch served (``current``) and the one a decided
    switch moves to (``target``), and autoBatch's observations and decisions: the last
    combined estimate (``observed``, when, the per-pod values and where they came from), the
    last ``sustain`` observations as (batch, time), the last decision as written (its
    ``outcome`` read back), the reconfigure annotation value handled, the fast trigger's
    state. :mod:`packrat.controller.planning.autobatch` makes new records from old."""

    current: int | None = None
    target: int | None = None
    observed: int | None = None
    observed_at: str | None = None
    estimates: tuple[int, ...] | None = None
    source: str | None = None
    recent: tuple[tuple[int, str], ...] = ()
    last_decision: Mapping[str, Any] | None = None
    reconfigure_handled: str | None = None
    fast: FastRecord | None = None

    @property
    def last_outcome(self) -> str | None:
        """The outcome of the last decision (None before the first)."""
        return _opt_str((self.last_decision or {}).get("outcome"))

    @classmethod
    def from_status(cls, doc: Any) -> BatchRecord:
        if not isinstance(doc, Mapping):
            return cls()
        recent = tuple(
            (int(o["batch"]), str(o["time"]))
            for o in doc.get("recent") or []
            if isinstance(o, Mapping) and _opt_int(o.get("batch")) is not None and "time" in o
        )
        estimates = doc.get("estimates")
        decision = doc.get("lastDecision")
        return cls(
            **{attr: read(doc.get(camel)) for attr, camel, read in _BATCH_SCALARS},
            estimates=tuple(int(e) for e in estimates if _opt_int(e) is not None)
            if isinstance(estimates, list)
            else None,
            recent=recent,
            last_decision=copy.deepcopy(dict(decision)) if isinstance(decision, Mapping) else None,
            fast=FastRecord.from_status(doc.get("fast")),
        )

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for attr, camel, _ in _BATCH_SCALARS:
            if (value := getattr(self, attr)) is not None:
                out[camel] = value
        if self.estimates is not None:
            out["estimates"] = list(self.estimates)
        if self.recent:
            out["recent"] = [{"batch": b, "time": t} for b, t in self.recent]
        if self.last_decision is not None:
            out["lastDecision"] = copy.deepcopy(dict(self.last_decision))
        if self.fast is not None:
            out["fast"] = self.fast.to_status()
        return out


_PROFILE_KEYS = (
    ("key", "key"),
    ("config_map", "configMap"),
    ("digest", "digest"),
    ("cpu_model", "cpuModel"),
    ("mode", "mode"),
    ("job", "job"),
    ("started_at", "startedAt"),
    ("attempts", "attempts"),
    ("last_failure", "lastFailure"),
    ("retry_at", "retryAt"),
    ("stuck", "stuck"),
    ("failed_generation", "failedGeneration"),
)


@dataclass(frozen=True)
class ProfileRecord:
    """``status.profile``: the profile for the spec's profile key, stored (``config_map``,
    ``digest``) or being measured (``job``, its ``attempts``, the last failure, when to retry,
    a stuck pod), or given up for ``failed_generation``."""

    key: str | None = None
    config_map: str | None = None
    digest: str | None = None
    cpu_model: str | None = None
    mode: Any = None
    job: str | None = None
    started_at: str | None = None
    attempts: int = 0
    last_failure: str | None = None
    retry_at: str | None = None
    stuck: str | None = None
    failed_generation: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    # -- the steps ---------------------------------------------------------------------------
    def for_key(self, key: str) -> ProfileRecord:
        """This record when it is for ``key``, else a new one for it (the spec changed)."""
        return self if self.key == key else ProfileRecord(key=key)

    def stored(
        self, *, config_map: str, digest: str, cpu_model: str | None, mode: Any
    ) -> ProfileRecord:
        """The profile is in ``config_map``: what measuring it left is dropped."""
        return replace(
            self,
            config_map=config_map,
            digest=digest,
            cpu_model=cpu_model,
            mode=mode,
            job=None,
            retry_at=None,
            last_failure=None,
            attempts=0,
            stuck=None,
        )

    def fresh_start(self) -> ProfileRecord:
        """The spec changed after giving up: no attempts, no retry time."""
        return replace(self, attempts=0, failed_generation=None, retry_at=None)

    def gave_up(self, generation: Any) -> ProfileRecord:
        return replace(self, failed_generation=generation)

    def started(self, *, job: str, started_at: str) -> ProfileRecord:
        return replace(self, job=job, started_at=started_at, retry_at=None, stuck=None)

    def stuck_on(self, why: str) -> ProfileRecord:
        return replace(self, stuck=why)

    def failed_attempt(self, *, failure: str, retry_at: str) -> ProfileRecord:
        """One more attempt failed (``failure``); the next starts at ``retry_at``."""
        return replace(
            self,
            attempts=self.attempts + 1,
            last_failure=failure,
            retry_at=retry_at,
            job=None,
            stuck=None,
        )

    # -- the status edge ---------------------------------------------------------------------
    @classmethod
    def from_status(cls, doc: Any) -> ProfileRecord:
        """The record ``status.profile`` holds (an empty one when it holds none)."""
        if not isinstance(doc, Mapping):
            return cls()
        attempts = doc.get("attempts")
        return cls(
            key=_opt_str(doc.get("key")),
            config_map=_opt_str(doc.get("configMap")),
            digest=_opt_str(doc.get("digest")),
            cpu_model=_opt_str(doc.get("cpuModel")),
            mode=doc.get("mode"),
            job=_opt_str(doc.get("job")),
            started_at=_opt_str(doc.get("startedAt")),
            attempts=int(attempts or 0),
            last_failure=_opt_str(doc.get("lastFailure")),
            retry_at=_opt_str(doc.get("retryAt")),
            stuck=_opt_str(doc.get("stuck")),
            failed_generation=doc.get("failedGeneration"),
            extra=_unknown(doc, _PROFILE_KEYS),
        )

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for attr, camel in _PROFILE_KEYS:
            value = getattr(self, attr)
            if value is not None and not (attr == "attempts" and value == 0):
                out[camel] = value
        return out


# -- spec.slo's provisioning, spec.autoscaling's tuner, spec.canary's rollout -----------------


@dataclass(frozen=True)
class ProvisioningRecord:
    """``status.provisioning``: the planner's answer for ``spec.slo``. The tuner reads its
    ``signature`` and planned ``replicas``; the rest (CPUs per replica, batch, cores, plan,
    simulated P99 and miss rate, baselines...) is for users, in its status form
    (``figures``). A P99 measured for an earlier answer (``measuredP99Ms``) is kept across
    re-plans."""

    signature: str | None = None
    replicas: int | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)
    measured_p99_ms: Any = None

    def replanned(self, answer: ProvisioningRecord) -> ProvisioningRecord:
        """The planner's new ``answer`` in place of this one (the measured P99 kept)."""
        return replace(answer, measured_p99_ms=self.measured_p99_ms)

    @classmethod
    def from_status(cls, doc: Any) -> ProvisioningRecord:
        """The record ``status.provisioning`` holds (an empty one when it holds none)."""
        if not isinstance(doc, Mapping):
            return cls()
        known = ("signature", "replicas", "measuredP99Ms")
        replicas = doc.get("replicas")
        return cls(
            signature=_opt_str(doc.get("signature")),
            replicas=replicas if isinstance(replicas, int) else None,
            figures={k: copy.deepcopy(v) for k, v in doc.items() if k not in known},
            measured_p99_ms=doc.get("measuredP99Ms"),
        )

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.signature is not None:
            out["signature"] = self.signature
        if self.replicas is not None:
            out["replicas"] = self.replicas
        out.update(copy.deepcopy(dict(self.figures)))
        if self.measured_p99_ms is not None:
            out["measuredP99Ms"] = self.measured_p99_ms
        return out


# AutoscalingRecord's fields: (attribute, status key), in the order they are written
_AUTOSCALING_KEYS = (
    ("signature", "signature"),
    ("mode", "mode"),
    ("planned", "planned"),
    ("startup", "startup"),
    ("replicas", "replicas"),
    ("envelope", "envelope"),
    ("last_decision", "lastDecision"),
    ("last_scale", "lastScale"),
)


@dataclass(frozen=True)
class AutoscalingRecord:
    """``status.autoscaling``: the envelope tuner's state for one reference (``signature``:
    the provisioning or ``spec.autoscaling.reference`` it scales from): what was planned, the
    start-up headroom, the replica count it serves (kept, so a restarted operator serves the
    same number), the envelope it last read, its last decision and the last one that changed
    the count (an HPA's ``lastScaleTime``). :mod:`packrat.controller.planning.autoscale`
    makes new records from old."""

    signature: str | None = None
    mode: str | None = None
    planned: Mapping[str, Any] | None = None
    startup: Mapping[str, Any] | None = None
    replicas: int | None = None
    envelope: Mapping[str, Any] | None = None
    last_decision: Mapping[str, Any] | None = None
    last_scale: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # unknown keys, kept as read

    # -- the steps ---------------------------------------------------------------------------
    def for_reference(self, signature: str) -> AutoscalingRecord:
        """This record when it scales from ``signature``, else a new one for it."""
        return self if self.signature == signature else AutoscalingRecord(signature=signature)

    def tuning(
        self, *, planned: Mapping[str, Any], startup: Mapping[str, Any]
    ) -> AutoscalingRecord:
        """The envelope tuner scales from ``planned`` with ``startup``'s headroom."""
        return replace(self, mode="envelope", planned=dict(planned), startup=dict(startup))

    def holding(self, replicas: int) -> AutoscalingRecord:
        """Nothing decided (no reading): ``replicas`` serve."""
        return replace(self, replicas=replicas)

    def decided(
        self, *, envelope: Mapping[str, Any], decision: Mapping[str, Any]
    ) -> AutoscalingRecord:
        """The tuner read ``envelope`` and made ``decision`` (its ``replicas`` and
        ``previous``); one that changed the count is kept as the last scale too."""
        changed = decision.get("replicas") != decision.get("previous")
        return replace(
            self,
            replicas=_opt_int(decision.get("replicas")),
            envelope=dict(envelope),
            last_decision=dict(decision),
            last_scale=dict(decision) if changed else self.last_scale,
        )

    # -- questions ---------------------------------------------------------------------------
    def serves(self, signature: str | None) -> int | None:
        """The count the tuner keeps for reference ``signature`` (None: none kept, or another
        reference's)."""
        return self.replicas if self.signature == signature and self.replicas else None

    # -- the status edge ---------------------------------------------------------------------
    @classmethod
    def from_status(cls, doc: Any) -> AutoscalingRecord:
        """The record ``status.autoscaling`` holds (an empty one when it holds none)."""
        if not isinstance(doc, Mapping):
            return cls()
        return cls(
            signature=_opt_str(doc.get("signature")),
            mode=_opt_str(doc.get("mode")),
            planned=_opt_map(doc.get("planned")),
            startup=_opt_map(doc.get("startup")),
            replicas=_opt_count(doc.get("replicas")),
            envelope=_opt_map(doc.get("envelope")),
            last_decision=_opt_map(doc.get("lastDecision")),
            last_scale=_opt_map(doc.get("lastScale")),
            extra=_unknown(doc, _AUTOSCALING_KEYS),
        )

    def to_status(self) -> dict[str, Any]:
        return _written(self, _AUTOSCALING_KEYS, self.extra)


def _opt_count(value: Any) -> int | None:
    """A count as read back (a JSON number; None when it is not one)."""
    number = _opt_float(value)
    return int(number) if number is not None else None


def _opt_map(value: Any) -> Mapping[str, Any] | None:
    return copy.deepcopy(dict(value)) if isinstance(value, Mapping) else None


class CanaryPhase(enum.StrEnum):
    """Where a canary is: its pods starting (or a stable pod not yet told its share), taking
    its share, or rolled back by its thresholds (kept until its model changes)."""

    STARTING = "Starting"
    PROGRESSING = "Progressing"
    ROLLED_BACK = "RolledBack"


# CanaryRecord's plain fields: (attribute, status key), in the order they are written
_CANARY_KEYS = (
    ("hash", "hash"),
    ("since", "since"),
    ("model", "model"),
    ("traffic_percent", "trafficPercent"),
    ("ready_replicas", "readyReplicas"),
    ("phase", "phase"),
)


@dataclass(frozen=True)
class CanaryRecord:
    """``status.canary``: the canary of ``spec.canary`` (``hash``: which one) since when, its
    model, share and ready pods, its phase, and what the stable pods counted for it
    (``requests``, ``errors``, the worst pod's P99; all three written together) with a
    message (a pod that failed to answer, why it was rolled back, why it is not stopped yet).
    :mod:`packrat.controller.switch.canary` makes new records from old."""

    hash: str | None = None
    since: str | None = None
    model: Mapping[str, Any] | None = None
    traffic_percent: int | None = None
    ready_replicas: int | None = None
    phase: CanaryPhase | str | None = None
    requests: int | None = None
    errors: int | None = None
    p99_ms: float | None = None
    message: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # unknown keys, kept as read

    # -- the steps ---------------------------------------------------------------------------
    def for_canary(self, canary_hash: str, *, now: str) -> CanaryRecord:
        """This record when it is for canary ``canary_hash``, else a new one from ``now``."""
        return self if self.hash == canary_hash else CanaryRecord(hash=canary_hash, since=now)

    def running(
        self, *, model: Mapping[str, Any], percent: int, ready_replicas: int
    ) -> CanaryRecord:
        return replace(
            self, model=dict(model), traffic_percent=percent, ready_replicas=ready_replicas
        )

    def starting(self) -> CanaryRecord:
        return replace(self, phase=CanaryPhase.STARTING)

    def counted(
        self, *, told_all: bool, requests: int, errors: int, p99_ms: float | None, message: str
    ) -> CanaryRecord:
        """What the stable pods counted; ``told_all``: every one of them takes the share."""
        phase = CanaryPhase.PROGRESSING if told_all else CanaryPhase.STARTING
        return replace(
            self, phase=phase, requests=requests, errors=errors, p99_ms=p99_ms, message=message
        )

    def rolled_back(self, message: str) -> CanaryRecord:
        return replace(self, phase=CanaryPhase.ROLLED_BACK, message=message, traffic_percent=0)

    def stopping(self, message: str) -> CanaryRecord:
        """Not stopped yet: ``message`` says which stable pods did not answer."""
        return replace(self, message=message)

    def settled(self) -> CanaryRecord:
        """Stopped: kept (a canary rolled back) with no share."""
        return replace(self, traffic_percent=0)

    # -- questions ---------------------------------------------------------------------------
    def rolled_back_for(self, canary_hash: str) -> bool:
        """Whether canary ``canary_hash`` was rolled back (it stays so)."""
        return self.phase == CanaryPhase.ROLLED_BACK and self.hash == canary_hash

    @property
    def progressing(self) -> bool:
        return self.phase == CanaryPhase.PROGRESSING

    # -- the status edge ---------------------------------------------------------------------
    @classmethod
    def from_status(cls, doc: Any) -> CanaryRecord | None:
        """The record ``status.canary`` holds (None when it holds none)."""
        if not isinstance(doc, Mapping):
            return None
        phase = doc.get("phase")
        return cls(
            hash=_opt_str(doc.get("hash")),
            since=_opt_str(doc.get("since")),
            model=_opt_map(doc.get("model")),
            traffic_percent=_opt_count(doc.get("trafficPercent")),
            ready_replicas=_opt_count(doc.get("readyReplicas")),
            phase=_canary_phase(phase) if phase is not None else None,
            requests=_opt_int(doc.get("requests")),
            errors=_opt_int(doc.get("errors")),
            p99_ms=_opt_float(doc.get("p99Ms")),
            message=_opt_str(doc.get("message")),
            extra=_unknown(doc, _CANARY_KEYS, "requests", "errors", "p99Ms", "message"),
        )

    def to_status(self) -> dict[str, Any]:
        out = _written(self, _CANARY_KEYS, self.extra)
        if self.requests is not None:  # the counts, together (a P99 of None: too few)
            out.update(requests=self.requests, errors=self.errors, p99Ms=self.p99_ms)
        if self.message is not None:
            out["message"] = self.message
        return out


def _canary_phase(value: Any) -> CanaryPhase | str:
    try:
        return CanaryPhase(str(value))
    except ValueError:
        return str(value)  # another operator's phase, kept as read


class Status(Mapping[str, Any]):
    """A pass's private copy of an object's status: read as a mapping (every value a copy),
    written only through its methods, which :func:`packrat.controller.core.context.run_pass`
    diffs against what was stored and writes once, when the pass ends. The phase is not
    written by any step: steps report what they found and ``phase`` derives it, in one
    place."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = copy.deepcopy(dict(stored or {}))

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        """The whole status as plain data (a copy)."""
        return copy.deepcopy(self._data)

    @property
    def phase(self) -> str:
        raise NotImplementedError

    # -- writing: common fields ---------------------------------------------------------------
    def _set(self, key: str, value: Any) -> None:
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = copy.deepcopy(value)

    def set_message(self, message: str | None) -> None:
        """``status.message`` (None removes it)."""
        self._set("message", message)

    def set_endpoint(self, name: str, namespace: str, port: int) -> None:
        self._set("endpoint", {"service": f"{name}.{namespace}.svc", "port": port})
        self._set("url", f"http://{name}.{namespace}.svc:{port}")  # the URL printer column

    def set_condition(
        self,
        type_: str,
        value: bool,
        reason: str,
        message: str = "",
        *,
        generation: int | None,
        now: str,
    ) -> None:
        self._data["conditions"] = set_condition(
            self._data.get("conditions"),
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        )

    def drop_condition(self, type_: str) -> None:
        """Remove the condition of ``type_`` (when there is one)."""
        kept = [c for c in self._data.get("conditions") or [] if c.get("type") != type_]
        if kept != (self._data.get("conditions") or []):
            self._data["conditions"] = kept

    def finish(self, generation: int | None) -> str:
        """Set ``phase`` (the machine's answer) and ``observedGeneration`` as a pass ends;
        returns the phase."""
        phase = self.phase
        self._data["phase"] = phase
        if generation is not None:
            self._data["observedGeneration"] = generation
        return phase


class ModelStatus(Status):
    """A PackratModel's status. Steps report the facts of the pass (``failed``,
    ``profiling``, ``awaiting_plan``, ``switching``, ``serving``); the last one reported
    stands, and ``phase`` derives from it with :func:`derive_phase`."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        super().__init__(stored)
        self._facts = Facts()
        # the served spec, typed once per pass (keyed on the servingSpec it was read from)
        self._served: tuple[dict[str, Any], ModelSpec] | None = None

    @property
    def phase(self) -> str:
        return derive_phase(self._facts)

    # -- the facts the phase follows from ---------------------------------------------------
    def failed(self, *, invalid: bool = False) -> None:
        self._facts = Facts(invalid=invalid, failed=not invalid)

    def profiling(self) -> None:
        self._facts = Facts(profiling=True)

    def awaiting_plan(self) -> None:
        """Profiled, not planned (a pipeline's stage before its pipeline's plan)."""
        self._facts = Facts(profiled=True)

    def switching(self) -> None:
        self._facts = Facts(profiled=True, planned=True, deployed=True, switching=True)

    def serving(self, *, ready_replicas: int, replicas: int) -> str:
        """Serving from the active slot with ``ready_replicas`` of ``replicas`` ready; the
        phase that follows."""
        self._facts = Facts(
            profiled=True,
            planned=True,
            deployed=True,
            ready_replicas=ready_replicas,
            replicas=replicas,
        )
        return self.phase

    # -- a pooled model (spec.pool) -----------------------------------------------------------
    def set_pool(self, record: Mapping[str, Any] | None) -> None:
        """``status.pool``: the pool and pool pod serving the model, what the pod reports of
        it (resident bytes, cold starts, last use); None: no pool serves it."""
        self._set("pool", dict(record) if record is not None else None)

    def set_pool_plan(self, record: Mapping[str, Any] | None) -> None:
        """``status.poolPlan``: a pooled model's plan on its pool's cores (the pool's pods
        run it with that plan's threads); None: none (not pooled, not planned yet)."""
        self._set("poolPlan", dict(record) if record is not None else None)

    @contextlib.contextmanager
    def facts_kept(self) -> Iterator[None]:
        """Steps run inside leave the phase's facts as they were (a pooled model's profile
        is measured while its pool serves it: profiling is not its phase)."""
        facts = self._facts
        try:
            yield
        finally:
            self._facts = facts

    @property
    def pool_pod(self) -> str | None:
        """The pool pod serving the model now (None: none)."""
        record = self._data.get("pool")
        pod = record.get("pod") if isinstance(record, Mapping) else None
        return pod if isinstance(pod, str) else None

    # -- what the active slot serves --------------------------------------------------------
    def set_serving(
        self,
        *,
        slot: str,
        serving_hash: str,
        plan: Plan,
        serving_spec: Mapping[str, Any],
    ) -> None:
        """The last good configuration: the active slot and what it serves."""
        self._data.update(
            activeSlot=slot,
            servingHash=serving_hash,
            plan=to_status(plan),
            servingSpec=copy.deepcopy(dict(serving_spec)),
        )

    @property
    def profile_digest(self) -> str:
        """The stored profile's digest (``status.profile.digest``; "" when none)."""
        return self.profile.digest or ""

    @property
    def served_plan(self) -> Plan | None:
        """The plan the active slot serves (None before the first deploy)."""
        return from_status(self._data.get("plan"))

    def served_spec(self, meta: Mapping[str, Any], *, image: str) -> ModelSpec | None:
        """The spec the active slot serves, typed (None before the first deploy): read from
        ``servingSpec`` once, for the object's ``meta`` (``image``: the operator's default,
        for a spec kept by an older operator)."""
        kept = self._data.get("servingSpec")
        if not kept:
            return None
        if self._served is None or self._served[0] != kept:
            self._served = (copy.deepcopy(kept), stored(meta, kept, image=image))
        return self._served[1]

    @property
    def serving_spec_doc(self) -> dict[str, Any]:
        """``status.servingSpec``, the spec the active slot serves in its stored form (a copy;
        empty before the first deploy)."""
        return copy.deepcopy(dict(self._data.get("servingSpec") or {}))

    def keep_serving_spec(self, spec: Mapping[str, Any]) -> None:
        """``servingSpec`` for a status from before it was kept (older operators)."""
        self._data.setdefault("servingSpec", copy.deepcopy(dict(spec)))

    def set_active_slot(self, slot: str) -> None:
        self._data["activeSlot"] = slot

    def set_ready_replicas(self, ready: int) -> None:
        self._data["readyReplicas"] = int(ready)

    def set_scale(self, replicas: int, selector: str) -> None:
        """``status.replicas`` and ``status.selector`` (the scale subresource)."""
        self._data["replicas"] = int(replicas)
        self._data["selector"] = selector

    # -- batch size, switches ---------------------------------------------------------------
    @property
    def batch(self) -> BatchRecord:
        """``status.batchSize``, typed (an empty record before the first)."""
        return BatchRecord.from_status(self._data.get("batchSize"))

    def set_batch(self, batch: BatchRecord) -> None:
        """``status.batchSize`` (autoBatch's observations and decision, current and target)."""
        self._set("batchSize", batch.to_status())

    @property
    def batch_current(self) -> int | None:
        """The batch the active slot serves (``status.batchSize.current``)."""
        return self.batch.current

    @property
    def batch_target(self) -> int | None:
        """The batch autoBatch decided to switch to (``status.batchSize.target``)."""
        return self.batch.target

    def set_batch_current(self, current: int) -> None:
        """Serving batch ``current`` (the first deploy; a target, if any, kept)."""
        self.set_batch(replace(self.batch, current=current))

    def batch_switching(self, *, current: int | None, target: int | None) -> None:
        """A switch from batch ``current`` to ``target`` under way."""
        self.set_batch(replace(self.batch, current=current, target=target))

    def batch_settled(self, current: int | None) -> None:
        """Serving batch ``current``, no switch under way."""
        self.set_batch(replace(self.batch, current=current, target=None))

    def batch_target_dropped(self) -> None:
        self.set_batch(replace(self.batch, target=None))

    def set_switch(self, switch: Switch | None) -> None:
        """``status.switch`` (a switch under way or given up; None: none)."""
        self._set("switch", None if switch is None else switch.to_status())

    @property
    def switch(self) -> Switch | None:
        """The switch under way or given up (None: none)."""
        return Switch.from_status(self._data.get("switch"))

    @property
    def last_switch(self) -> tuple[str | None, datetime.datetime | None]:
        """(result, time) of the last switch (``status.lastSwitch``; None, None before it)."""
        last = self._data.get("lastSwitch")
        if not isinstance(last, Mapping):
            return None, None
        return _opt_str(last.get("result")), parse_time(last.get("time"))

    def record_switch(
        self, last: Mapping[str, Any], entry: Mapping[str, Any], *, limit: int = 10
    ) -> None:
        """``status.lastSwitch`` and one more entry in the bounded ``switchHistory``."""
        self._set("lastSwitch", dict(last))
        history = [dict(h) for h in self._data.get("switchHistory") or []]
        history.append(copy.deepcopy(dict(entry)))
        self._data["switchHistory"] = history[-limit:]

    # -- profile, storage, provisioning, autoscaling ----------------------------------------
    @property
    def profile(self) -> ProfileRecord:
        """``status.profile`` (an empty record before the first pass)."""
        return ProfileRecord.from_status(self._data.get("profile"))

    def set_profile(self, profile: ProfileRecord) -> None:
        self._set("profile", profile.to_status())

    def set_profiling_progress(self, progress: Mapping[str, Any] | None) -> None:
        """``status.profiling.progress`` while a profiling Job runs (None removes it)."""
        self._set("profiling", None if progress is None else {"progress": dict(progress)})

    def set_storage(self, storage: Mapping[str, Any]) -> None:
        self._set("storage", dict(storage))

    def set_measured(self, measured: Mapping[str, Any] | None) -> None:
        self._set("measured", None if measured is None else dict(measured))

    @property
    def provisioning(self) -> ProvisioningRecord:
        """``status.provisioning`` (an empty record before the first)."""
        return ProvisioningRecord.from_status(self._data.get("provisioning"))

    def set_provisioning(self, provisioning: ProvisioningRecord) -> None:
        self._set("provisioning", provisioning.to_status())

    @property
    def autoscaling(self) -> AutoscalingRecord:
        """``status.autoscaling`` (an empty record before the tuner's first decision)."""
        return AutoscalingRecord.from_status(self._data.get("autoscaling"))

    def set_autoscaling(self, autoscaling: AutoscalingRecord) -> None:
        self._set("autoscaling", autoscaling.to_status())

    @property
    def canary(self) -> CanaryRecord | None:
        """``status.canary`` (None: no canary, nor one kept rolled back)."""
        return CanaryRecord.from_status(self._data.get("canary"))

    def set_canary(self, canary: CanaryRecord | None) -> None:
        """``status.canary`` (spec.canary's rollout; None removes it)."""
        self._set("canary", None if canary is None else canary.to_status())


class PipelineStatus(Status):
    """A PackratPipeline's status; ``phase`` derives from the facts the pass reports with
    :func:`derive_pipeline_phase`."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        super().__init__(stored)
        self._facts = PipelineFacts()

    @property
    def phase(self) -> str:
        return derive_pipeline_phase(self._facts)

    def failed(self) -> None:
        self._facts = PipelineFacts(failed=True)

    def waiting(self, *, missing_profiles: bool) -> None:
        self._facts = PipelineFacts(missing_profiles=missing_profiles)

    def serving(self) -> None:
        self._facts = PipelineFacts(serving=True)

    def set_measured(self, queries: int, p99_ms: float | None) -> None:
        """The routers' measured end-to-end latency over the trailing window (``p99_ms``
        None: too few queries in it)."""
        self._data["measuredQueries"] = int(queries)
        self._set("measuredP99Ms", p99_ms)

    def set_edges(self, edges: list[dict[str, Any]] | None) -> None:
        """``status.edges``: per edge the declared fraction, the measured one (smoothed, its
        weight and samples) and the one the planner uses once there are enough samples."""
        self._set("edges", edges)

    def judge_slo(self, slo_ms: float) -> None:
        """``sloMet`` from the measured P99 when there is one (else the simulated one's)."""
        if "measuredP99Ms" in self._data:
            self._data["sloMet"] = bool(self._data["measuredP99Ms"] <= slo_ms)

    def set_plan(
        self,
        *,
        signature: str,
        cores: int,
        simulated_p99_ms: float | None,
        slo_met: bool,
        baselines: Mapping[str, Any],
    ) -> None:
        self._data.update(
            planSignature=signature,
            cores=cores,
            sloMet=slo_met,
            baselines=copy.deepcopy(dict(baselines)),
        )
        self._set("simulatedP99Ms", simulated_p99_ms)

    def set_planning(self, failure: Mapping[str, Any] | None) -> None:
        """The last planning run over its budget (signature, reason, message), or None."""
        self._set("planning", dict(failure) if failure is not None else None)

    def set_stages(self, stages: Sequence[Mapping[str, Any]]) -> None:
        self._data["stages"] = [copy.deepcopy(dict(s)) for s in stages]

    def set_router(self, replicas: int, ready_replicas: int) -> None:
        self._data["router"] = {"replicas": int(replicas), "readyReplicas": int(ready_replicas)}
