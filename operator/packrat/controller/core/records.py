"""Typed records for the parts of a model's status that steps read back: the switch under
way (``status.switch``) and the batch being served (``status.batchSize``'s current and
target). Each is converted once, at the status edge (:class:`~packrat.controller.core.status.
ModelStatus`), as plans are (:mod:`packrat.controller.core.plans`): steps read attributes and
call the record's steps, never string keys.

``status.switch`` moves through its stages in one direction::

    rollout --moved--> draining --(done: removed)
       \\--aborted--> aborted --(spec changed, or served: removed)

A record keeps what it was read from (``extra``) so fields this operator does not know
(a newer one's) survive a pass.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from packrat.controller.core.plans import from_status, to_status
from packrat.plan.optimizer import Plan


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
        return cls(
            stage=Stage.ROLLOUT,
            from_slot=from_slot,
            target_slot=target_slot,
            hash=serving_hash,
            spec=dict(spec),
            reason=reason,
            started_at=started_at,
            plan=plan,
        )

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
        known = {camel for _, camel in _KEYS} | {"plan"}
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
            extra={k: v for k, v in doc.items() if k not in known},
        )

    def to_status(self) -> dict[str, Any]:
        """The status form (fields not set are left out)."""
        out: dict[str, Any] = dict(self.extra)
        for attr, camel in _KEYS:
            value = getattr(self, attr)
            if value is not None:
                out[camel] = value.value if isinstance(value, Stage) else value
        if self.plan is not None:
            out["plan"] = to_status(self.plan)
        return out


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
        known = {camel for _, camel in _PROFILE_KEYS}
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
            extra={k: v for k, v in doc.items() if k not in known},
        )

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for attr, camel in _PROFILE_KEYS:
            value = getattr(self, attr)
            if value is not None and not (attr == "attempts" and value == 0):
                out[camel] = value
        return out
