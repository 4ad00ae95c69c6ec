"""Pure status logic: the phase machine and standard Kubernetes conditions.

Phases and conditions are what users and tools read (``kubectl get prm``, ``kubectl wait
--for=condition=Ready``), so their rules live here, free of I/O and unit-tested:
``lastTransitionTime`` moves only when a condition's status flips.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        changed = cond.get("status") != value
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp if changed else cond.get("lastTransitionTime", stamp),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    if not found:
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
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
