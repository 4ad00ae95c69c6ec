"""``spec.canary``: a new model source served beside the current one, with a share of the
traffic and the thresholds that roll it back by themselves (pure: validation and the typed
settings; the rollout is :mod:`packrat.controller.switch.canary`).

::

    canary:
      model: {storageUri: s3://models/resnet50/v2.pt}   # the new version, as spec.model
      trafficPercent: 10                                # 0..100 of the predictions
      replicas: 1                                       # canary pods (default 1)
      rollback:                                         # automatic rollback (optional)
        maxErrorRate: 0.05                              # failed / canary requests
        maxP99Ms: 800                                   # P99 of the canary's latency
        minRequests: 50                                 # judged only after this many

Promote: set ``spec.model`` to the canary's model and remove ``spec.canary``. Roll back: remove
``spec.canary`` (or set ``trafficPercent: 0``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.model_source import validate_model
from packrat.controller.core.options.fields import known_object

FIELD = "canary"
_FIELDS = {"model", "trafficPercent", "replicas", "rollback"}
_ROLLBACK_FIELDS = {"maxErrorRate", "maxP99Ms", "minRequests"}
DEFAULT_MIN_REQUESTS = 20


@dataclass(frozen=True, slots=True)
class CanarySettings:
    model: Mapping[str, Any]
    percent: int
    replicas: int
    max_error_rate: float | None
    max_p99_ms: float | None
    min_requests: int

    @property
    def hash(self) -> str:
        """The canary's identity: its model source (a new one is a new canary)."""
        raw = json.dumps(dict(self.model), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:16]


def canary_settings(spec: Mapping[str, Any]) -> CanarySettings | None:
    """The valid ``spec.canary`` as settings (None when absent)."""
    canary = spec.get(FIELD)
    if not isinstance(canary, Mapping):
        return None
    rollback = canary.get("rollback") or {}
    return CanarySettings(
        model=_plain(canary["model"]),
        percent=int(canary["trafficPercent"]),
        replicas=int(canary.get("replicas", 1)),
        max_error_rate=_float(rollback.get("maxErrorRate")),
        max_p99_ms=_float(rollback.get("maxP99Ms")),
        min_requests=int(rollback.get("minRequests", DEFAULT_MIN_REQUESTS)),
    )


def _plain(value: Any) -> Any:
    """Plain JSON data from a (read-only) view of it."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def validate_canary(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append a message for every problem with ``spec.canary`` (as the CRD checks)."""
    where = f"spec.{FIELD}"
    canary = known_object(errors, spec.get(FIELD), where=where, fields=_FIELDS)
    if canary is None:
        return
    if "model" not in canary:
        errors.append(f"{where}.model is required")
    else:
        found: list[str] = []
        validate_model(found, canary["model"])
        errors += [e.replace("spec.model", f"{where}.model") for e in found]
        if canary["model"] == spec.get("model"):
            errors.append(f"{where}.model is spec.model: a canary serves a different model")
    _int(errors, canary, "trafficPercent", where=where, bounds=(0, 100), required=True)
    _int(errors, canary, "replicas", where=where, bounds=(1, 100))
    rollback = known_object(
        errors, canary.get("rollback"), where=f"{where}.rollback", fields=_ROLLBACK_FIELDS
    )
    if rollback is None:
        return
    rate = rollback.get("maxErrorRate")
    if rate is not None and not (_number(rate) and 0 <= rate <= 1):
        errors.append(f"{where}.rollback.maxErrorRate must be in [0, 1], got {rate!r}")
    p99 = rollback.get("maxP99Ms")
    if p99 is not None and not (_number(p99) and 0 < p99 <= 3_600_000):
        errors.append(f"{where}.rollback.maxP99Ms must be in (0, 3600000], got {p99!r}")
    _int(errors, rollback, "minRequests", where=f"{where}.rollback", bounds=(1, 1_000_000))


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _int(
    errors: list[str],
    obj: Mapping[str, Any],
    key: str,
    *,
    where: str,
    bounds: tuple[int, int],
    required: bool = False,
) -> None:
    low, high = bounds
    value = obj.get(key)
    if value is None:
        if required:
            errors.append(f"{where}.{key} is required")
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors.append(f"{where}.{key} must be an integer in {low}..{high}, got {value!r}")
