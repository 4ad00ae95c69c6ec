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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from packrat.controller.api.schema import MODEL_CRD, schema_defaults

# the CRD's defaults (its ``default:`` values, the one source), filled in as the API server
# would for a spec that did not pass one (an emulator, a YAML file, a test)
SLO_DEFAULTS: dict[str, Any] = schema_defaults(MODEL_CRD, "spec", "slo")
AUTOSCALING_DEFAULTS: dict[str, Any] = schema_defaults(MODEL_CRD, "spec", "autoscaling")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


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


def validate_slo(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append every problem with ``spec.slo`` and ``spec.autoscaling`` (defaults filled in)
    the CRD's schema and CEL rules cannot state: the synthetic trace's size, the ingress's
    Service name and the reference's windows in order."""
    slo = spec.get("slo")
    if isinstance(slo, Mapping):
        rate, duration = slo.get("rate"), slo.get("durationSeconds")
        if _number(rate) and _number(duration) and rate * duration > 200_000:
            errors.append("spec.slo: rate x durationSeconds must be at most 200000 arrivals")
    auto = spec.get("autoscaling")
    if not isinstance(auto, Mapping):
        return
    ingress = auto.get("ingress")
    service = ingress.get("service") if isinstance(ingress, Mapping) else None
    if isinstance(service, str) and not _DNS_LABEL.fullmatch(service):
        where = "spec.autoscaling.ingress.service"
        errors.append(f"{where} must be a Service name (DNS-1035 label), got {service!r}")
    ref = auto.get("reference")
    windows = ref.get("windowsSeconds") if isinstance(ref, Mapping) else None
    if isinstance(windows, list) and not all(
        _number(a) and _number(b) and a < b for a, b in itertools.pairwise(windows)
    ):
        errors.append("spec.autoscaling.reference.windowsSeconds must increase")
