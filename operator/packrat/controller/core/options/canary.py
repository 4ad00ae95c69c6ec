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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.frozen import thaw
from packrat.controller.api.schema import MODEL_CRD, schema_check
from packrat.controller.core.model_source import validate_model

FIELD = "canary"
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
        model=thaw(canary["model"]),
        percent=int(canary["trafficPercent"]),
        replicas=int(canary.get("replicas", 1)),
        max_error_rate=_float(rollback.get("maxErrorRate")),
        max_p99_ms=_float(rollback.get("maxP99Ms")),
        min_requests=int(rollback.get("minRequests", DEFAULT_MIN_REQUESTS)),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def validate_canary(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append a message for every problem with ``spec.canary`` the CRD's schema does not
    check: its model (the CRD keeps it as given) against spec.model's schema and rules, and
    that it differs from spec.model."""
    where = f"spec.{FIELD}"
    canary = spec.get(FIELD)
    model = canary.get("model") if isinstance(canary, Mapping) else None
    if model is None:
        return  # absent (the schema check reports a missing one)
    more: list[str] = []
    validate_model(more, model, where=f"{where}.model")
    errors += schema_check(MODEL_CRD, "spec", "model").errors(model, f"{where}.model", extra=more)
    if model == spec.get("model"):
        errors.append(f"{where}.model is spec.model: a canary serves a different model")
