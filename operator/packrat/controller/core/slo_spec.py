"""``spec.slo`` and ``spec.autoscaling``: defaults and validation (InferLine in the operator).

``spec.slo`` asks the operator to provision for a P99 latency objective: it then chooses the
replica count, the replica size (CPUs per replica, at most ``spec.cpus``) and the serving
batch with :mod:`packrat.plan.provision`, on a sample arrival trace taken from a ConfigMap
(``slo.trace``) or generated from a rate and CV (gamma inter-arrivals). With an SLO the batch
is the planner's, so ``batchSize`` must not be set; with ``autoBatch`` too, the planner's
batch is where the plan starts and the plan inside a replica then follows the batch the load
presents (Packrat's reconfiguration) while the tuner sets the replicas.

``spec.autoscaling`` says who changes the replica count: ``envelope`` (the operator's tuner,
from the traffic envelopes of the arrivals the pods see, within min/max replicas) or
``external`` (an HPA or KEDA through the scale subresource; the operator follows
``spec.replicas`` and never writes it).

The tuner scales from a reference: the planned replica count, one replica's capacity and the
traffic envelope the planned replicas were simulated to sustain. With ``spec.slo`` the
model's own planner makes it; a model without an SLO may be given one in
``spec.autoscaling.reference`` (a PackratPipeline gives its stage models the one its
pipeline planner simulated for the arrivals that stage sees), and the tuner then scales
``spec.replicas``'s serving count from it as for an SLO model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

SLO_DEFAULTS: dict[str, Any] = {"cv": 1.0, "durationSeconds": 120}
AUTOSCALING_DEFAULTS: dict[str, Any] = {
    "mode": "envelope",
    "minReplicas": 1,
    "maxReplicas": 10,
    "scaleDownDelaySeconds": 120,
    "intervalSeconds": 5,
    "startupFloorSeconds": 0,
}
MODES = ("envelope", "external")
SLO_FIELDS = {"latencyP99Ms", "trace", "rate", "cv", "durationSeconds", "maxCores"}
TRACE_FIELDS = {"configMap", "key"}
AUTOSCALING_FIELDS = {*AUTOSCALING_DEFAULTS, "reference", "ingress"}
INGRESS_FIELDS = {"service", "scaleFactor"}
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
REFERENCE_FIELDS = {"replicas", "capacityPerReplica", "windowsSeconds", "ratesPerSecond"}
MAX_WINDOWS = 32


@dataclass(frozen=True, slots=True)
class TunerReference:
    """What the tuner scales from (see the module docstring); ``signature`` changes with any
    of it (a new reference is a new tuner, as a new plan is)."""

    signature: str
    replicas: int
    capacity: float  # queries per second one replica sustains at best
    windows: tuple[float, ...]  # seconds
    planned_rates: tuple[float, ...]  # per second, one per window
    # (horizon s, factor): how much the sample's rate grew within each horizon (a reference
    # given in the spec has none: no start-up headroom)
    growth: tuple[tuple[float, float], ...] = ()

    def to_spec(self) -> dict[str, Any]:
        """As ``spec.autoscaling.reference``."""
        return {
            "replicas": self.replicas,
            "capacityPerReplica": self.capacity,
            "windowsSeconds": list(self.windows),
            "ratesPerSecond": list(self.planned_rates),
        }


def reference_from_spec(doc: Mapping[str, Any]) -> TunerReference:
    """``spec.autoscaling.reference`` (validated) as a :class:`TunerReference`."""
    replicas = int(doc["replicas"])
    capacity = float(doc["capacityPerReplica"])
    windows = tuple(float(w) for w in doc["windowsSeconds"])
    rates = tuple(float(r) for r in doc["ratesPerSecond"])
    body = [replicas, capacity, windows, rates]
    digest = hashlib.sha256(json.dumps(body).encode()).hexdigest()[:16]
    return TunerReference(
        signature=f"ref:{digest}",
        replicas=replicas,
        capacity=capacity,
        windows=windows,
        planned_rates=rates,
    )


@dataclass(frozen=True)
class Slo:
    """``spec.slo`` of a valid spec (a model's or a pipeline's), typed once with its
    defaults (:data:`SLO_DEFAULTS`): the P99 objective, and the sample arrivals it is planned
    on, a gamma trace at ``rate`` (its ``cv``, over ``duration_seconds``) or a recorded one
    (``trace``: its ConfigMap and key)."""

    latency_p99_ms: float
    rate: float | None
    cv: float
    duration_seconds: float
    max_cores: int | None
    trace: tuple[str, str] | None  # (ConfigMap, key)

    @classmethod
    def of(cls, slo: Mapping[str, Any]) -> Slo:
        full = {**SLO_DEFAULTS, **slo}
        trace, rate, cores = full.get("trace"), full.get("rate"), full.get("maxCores")
        return cls(
            latency_p99_ms=float(full["latencyP99Ms"]),
            rate=float(rate) if rate is not None else None,
            cv=float(full["cv"]),
            duration_seconds=float(full["durationSeconds"]),
            max_cores=int(cores) if cores is not None else None,
            trace=(
                (str(trace["configMap"]), str(trace["key"])) if isinstance(trace, Mapping) else None
            ),
        )


@dataclass(frozen=True)
class Autoscaling:
    """``spec.autoscaling`` of a valid spec, typed once with its defaults
    (:data:`AUTOSCALING_DEFAULTS`, filled in by :func:`with_slo_defaults`): who changes the
    replica count (``mode``), within which bounds, how often the tuner looks, and where its
    arrivals come from (``ingress``: a Service and a scale factor)."""

    mode: str
    min_replicas: int
    max_replicas: int
    scale_down_delay_seconds: float
    interval_seconds: float
    startup_floor_seconds: float
    has_reference: bool  # autoscaling.reference given (typed: ``ModelSpec.reference``)
    ingress: tuple[str, float] | None
    signature: str  # every field as given (a tuner is rebuilt when it changes)

    @classmethod
    def of(cls, auto: Mapping[str, Any]) -> Autoscaling:
        """The typed form of a validated ``spec.autoscaling`` (defaults filled in)."""
        full = {**AUTOSCALING_DEFAULTS, **auto}
        ingress = full.get("ingress")
        return cls(
            mode=str(full["mode"]),
            min_replicas=int(full["minReplicas"]),
            max_replicas=int(full["maxReplicas"]),
            scale_down_delay_seconds=float(full["scaleDownDelaySeconds"]),
            interval_seconds=float(full["intervalSeconds"]),
            startup_floor_seconds=float(full["startupFloorSeconds"]),
            has_reference=isinstance(full.get("reference"), Mapping),
            ingress=(
                (str(ingress["service"]), float(ingress["scaleFactor"]))
                if isinstance(ingress, Mapping)
                else None
            ),
            signature=repr(sorted(full.items())),
        )


def spec_reference(spec: Mapping[str, Any]) -> TunerReference | None:
    """The reference a (validated) spec gives its tuner itself, if any."""
    auto = spec.get("autoscaling")
    ref = auto.get("reference") if isinstance(auto, Mapping) else None
    return reference_from_spec(ref) if isinstance(ref, Mapping) else None


def with_slo_defaults(spec: dict[str, Any]) -> None:
    """Fill ``slo`` and ``autoscaling`` defaults in place (objects only; others stay as given)."""
    slo = spec.get("slo")
    if isinstance(slo, Mapping):
        spec["slo"] = {**SLO_DEFAULTS, **slo}
    auto = spec.get("autoscaling")
    if isinstance(auto, Mapping):
        spec["autoscaling"] = {**AUTOSCALING_DEFAULTS, **auto}


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_slo(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append every problem with ``spec.slo`` and ``spec.autoscaling`` (defaults filled in)."""
    slo = spec.get("slo")
    if slo is not None:
        _validate_slo(errors, slo, spec)
    auto = spec.get("autoscaling")
    if auto is not None:
        _validate_autoscaling(errors, auto, has_slo=slo is not None)


def _object(
    errors: list[str], value: Any, where: str, fields: set[str], what: str = "an object"
) -> Mapping[str, Any] | None:
    """``value`` when it is an object (each field it has that is not one of ``fields`` an
    error), else None and that error."""
    if not isinstance(value, Mapping):
        errors.append(f"{where} must be {what}")
        return None
    for key in sorted(set(value) - fields):
        errors.append(f"{where}.{key}: unknown field")
    return value


def _validate_slo(errors: list[str], value: Any, spec: Mapping[str, Any]) -> None:
    slo = _object(errors, value, "spec.slo", SLO_FIELDS)
    if slo is None:
        return
    p99 = slo.get("latencyP99Ms")
    if not _number(p99) or not 0 < p99 <= 3_600_000:
        errors.append(f"spec.slo.latencyP99Ms must be a number of ms in (0, 3600000], got {p99!r}")
    has_trace, has_rate = "trace" in slo, "rate" in slo
    if has_trace == has_rate:
        errors.append("exactly one of slo.trace and slo.rate must be set")
    if has_rate and (not _number(slo["rate"]) or not 0 < slo["rate"] <= 100_000):
        errors.append(
            f"spec.slo.rate must be a number in (0, 100000] per second, got {slo['rate']!r}"
        )
    cv = slo.get("cv")
    if not _number(cv) or not 0 < cv <= 100:
        errors.append(f"spec.slo.cv must be a number in (0, 100], got {cv!r}")
    duration = slo.get("durationSeconds")
    if not _int(duration) or not 1 <= duration <= 3600:
        errors.append(f"spec.slo.durationSeconds must be an integer in 1..3600, got {duration!r}")
    if _number(slo.get("rate")) and _int(duration) and slo["rate"] * duration > 200_000:
        errors.append("slo.rate x slo.durationSeconds must be at most 200000 arrivals")
    cores = slo.get("maxCores")
    if cores is not None and (not _int(cores) or not 1 <= cores <= 10_000):
        errors.append(f"spec.slo.maxCores must be an integer in 1..10000, got {cores!r}")
    trace = _object(errors, slo["trace"], "spec.slo.trace", TRACE_FIELDS) if has_trace else None
    if trace is not None:
        for key in ("configMap", "key"):
            value = trace.get(key)
            if not isinstance(value, str) or not value or len(value) > 253:
                errors.append(f"spec.slo.trace.{key} must be a non-empty name, got {value!r}")
    if "batchSize" in spec:
        errors.append(
            "with slo the planner chooses the batch: do not set batchSize "
            "(autoBatch lets it follow the load)"
        )


def _validate_autoscaling(errors: list[str], value: Any, *, has_slo: bool) -> None:
    auto = _object(errors, value, "spec.autoscaling", AUTOSCALING_FIELDS)
    if auto is None:
        return
    mode = auto.get("mode")
    if mode not in MODES:
        errors.append(f"spec.autoscaling.mode must be one of {', '.join(MODES)}, got {mode!r}")
    bounds = {"minReplicas": (1, 100), "maxReplicas": (1, 100)}
    bounds |= {"scaleDownDelaySeconds": (0, 86400), "intervalSeconds": (1, 3600)}
    bounds |= {"startupFloorSeconds": (0, 3600)}
    for key, (lo, hi) in bounds.items():
        value = auto.get(key)
        if not _int(value) or not lo <= value <= hi:
            errors.append(f"spec.autoscaling.{key} must be an integer in {lo}..{hi}, got {value!r}")
    lo_r, hi_r = auto.get("minReplicas"), auto.get("maxReplicas")
    if _int(lo_r) and _int(hi_r) and lo_r > hi_r:
        errors.append("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
    if "ingress" in auto:
        _validate_ingress(errors, auto["ingress"])
    ref = auto.get("reference")
    if ref is not None:
        if has_slo:
            errors.append("autoscaling.reference is for a model without slo (slo makes its own)")
        if mode != "envelope":
            errors.append("autoscaling.reference is for mode envelope")
        _validate_reference(errors, ref)
    elif mode == "envelope" and not has_slo:
        errors.append(
            "autoscaling.mode envelope needs spec.slo or autoscaling.reference "
            "(the plan the tuner scales)"
        )


def _validate_ingress(errors: list[str], value: Any) -> None:
    where = "spec.autoscaling.ingress"
    what = "an object with service and scaleFactor"
    ingress = _object(errors, value, where, INGRESS_FIELDS, what)
    if ingress is None:
        return
    service = ingress.get("service")
    if not isinstance(service, str) or not _DNS_LABEL.fullmatch(service):
        errors.append(f"{where}.service must be a Service name (DNS-1035 label), got {service!r}")
    factor = ingress.get("scaleFactor")
    if not _finite(factor, 0.0, 1.0) or factor <= 0:
        errors.append(f"{where}.scaleFactor must be a number in (0, 1], got {factor!r}")


def _finite(value: Any, lo: float, hi: float) -> TypeGuard[int | float]:
    return _number(value) and math.isfinite(value) and lo <= value <= hi


def _validate_reference(errors: list[str], value: Any) -> None:
    where = "spec.autoscaling.reference"
    ref = _object(errors, value, where, REFERENCE_FIELDS)
    if ref is None:
        return
    replicas = ref.get("replicas")
    if not _int(replicas) or not 1 <= replicas <= 100:
        errors.append(f"{where}.replicas must be an integer in 1..100, got {replicas!r}")
    capacity = ref.get("capacityPerReplica")
    if not (_finite(capacity, 0.0, 1e7) and capacity > 0):
        errors.append(f"{where}.capacityPerReplica must be a number in (0, 1e7], got {capacity!r}")
    windows, rates = ref.get("windowsSeconds"), ref.get("ratesPerSecond")
    if (
        not isinstance(windows, list)
        or not 1 <= len(windows) <= MAX_WINDOWS
        or not all(_finite(w, 1e-6, 3600.0) for w in windows)
        or any(b <= a for a, b in itertools.pairwise(windows))
    ):
        errors.append(
            f"{where}.windowsSeconds must be 1..{MAX_WINDOWS} increasing numbers in (0, 3600]"
        )
    if (
        not isinstance(rates, list)
        or not all(_finite(r, 0.0, 1e7) for r in rates)
        or not isinstance(windows, list)
        or len(rates) != len(windows)
    ):
        errors.append(f"{where}.ratesPerSecond must be one number in [0, 1e7] per window")
