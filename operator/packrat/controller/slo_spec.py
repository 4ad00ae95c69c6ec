"""``spec.slo`` and ``spec.autoscaling``: defaults and validation (InferLine in the operator).

``spec.slo`` asks the operator to provision for a P99 latency objective: it then chooses the
replica count, the replica size (CPUs per replica, at most ``spec.cpus``) and the serving
batch with :mod:`packrat.plan.provision`, on a sample arrival trace taken from a ConfigMap
(``slo.trace``) or generated from a rate and CV (gamma inter-arrivals). With an SLO the batch
is the planner's, so ``batchSize`` and ``autoBatch`` must not be set.

``spec.autoscaling`` says who changes the replica count: ``envelope`` (the operator's tuner,
from the traffic envelopes of the arrivals the pods see, within min/max replicas) or
``external`` (an HPA or KEDA through the scale subresource; the operator follows
``spec.replicas`` and never writes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

SLO_DEFAULTS: dict[str, Any] = {"cv": 1.0, "durationSeconds": 120}
AUTOSCALING_DEFAULTS: dict[str, Any] = {
    "mode": "envelope",
    "minReplicas": 1,
    "maxReplicas": 10,
    "scaleDownDelaySeconds": 120,
    "intervalSeconds": 5,
}
MODES = ("envelope", "external")
SLO_FIELDS = {"latencyP99Ms", "trace", "rate", "cv", "durationSeconds", "maxCores"}
TRACE_FIELDS = {"configMap", "key"}
AUTOSCALING_FIELDS = set(AUTOSCALING_DEFAULTS)


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


def _validate_slo(errors: list[str], slo: Any, spec: Mapping[str, Any]) -> None:
    if not isinstance(slo, Mapping):
        errors.append("spec.slo must be an object")
        return
    for key in sorted(set(slo) - SLO_FIELDS):
        errors.append(f"spec.slo.{key}: unknown field")
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
    if has_trace:
        trace = slo["trace"]
        if not isinstance(trace, Mapping):
            errors.append("spec.slo.trace must be an object")
        else:
            for key in sorted(set(trace) - TRACE_FIELDS):
                errors.append(f"spec.slo.trace.{key}: unknown field")
            for key in ("configMap", "key"):
                value = trace.get(key)
                if not isinstance(value, str) or not value or len(value) > 253:
                    errors.append(f"spec.slo.trace.{key} must be a non-empty name, got {value!r}")
    if "batchSize" in spec or "autoBatch" in spec:
        errors.append("with slo the planner chooses the batch: set neither batchSize nor autoBatch")


def _validate_autoscaling(errors: list[str], auto: Any, *, has_slo: bool) -> None:
    if not isinstance(auto, Mapping):
        errors.append("spec.autoscaling must be an object")
        return
    for key in sorted(set(auto) - AUTOSCALING_FIELDS):
        errors.append(f"spec.autoscaling.{key}: unknown field")
    mode = auto.get("mode")
    if mode not in MODES:
        errors.append(f"spec.autoscaling.mode must be one of {', '.join(MODES)}, got {mode!r}")
    bounds = {"minReplicas": (1, 100), "maxReplicas": (1, 100)}
    bounds |= {"scaleDownDelaySeconds": (0, 86400), "intervalSeconds": (1, 3600)}
    for key, (lo, hi) in bounds.items():
        value = auto.get(key)
        if not _int(value) or not lo <= value <= hi:
            errors.append(f"spec.autoscaling.{key} must be an integer in {lo}..{hi}, got {value!r}")
    lo_r, hi_r = auto.get("minReplicas"), auto.get("maxReplicas")
    if _int(lo_r) and _int(hi_r) and lo_r > hi_r:
        errors.append("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
    if mode == "envelope" and not has_slo:
        errors.append("autoscaling.mode envelope needs spec.slo (the plan the tuner scales)")
