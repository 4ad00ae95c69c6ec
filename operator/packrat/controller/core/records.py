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
