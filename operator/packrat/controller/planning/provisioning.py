"""``spec.slo`` in a pass: the sample trace in, InferLine's provisioning out.

The planner (:mod:`packrat.plan.provision`) chooses replicas, CPUs per replica and batch for
the SLO on a sample trace (from the ConfigMap ``slo.trace`` names, or gamma arrivals at
``slo.rate`` with ``slo.cv``); its answer is cached by everything it depends on (profile,
trace, SLO, limits), since a search simulates tens of configurations. What was chosen, the
simulated P99 and the coarse-grained baselines go to ``status.provisioning``; the condition
``Provisioned`` says whether the SLO is feasible (``Infeasible``: the configuration with the
lowest simulated P99 is served, and a Warning event says so) or why nothing could be planned
(``TraceUnavailable``: the last good configuration keeps serving). The tuner's parameters
(capacity per replica, planned envelope) come from here too.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from packrat.controller.core.cache import Lru
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.context import Pass as AnyPass
from packrat.controller.core.context import report_provisioned
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.slo_spec import Slo, TunerReference
from packrat.controller.core.status import ProvisioningRecord
from packrat.plan.envelope import envelope, growth_curve, window_sizes
from packrat.plan.optimizer import Plan
from packrat.plan.profile import Profile
from packrat.plan.provision import Planner, SimSettings, provision
from packrat.plan.traces import TraceError, gamma_trace, parse_trace

MAX_TRACE_BYTES = 4 * 1024 * 1024
# The tuner's shortest window. Arrivals are stamped in the pods' event loops behind the
# Service's proxies, whose scheduling jitter under load is tens of milliseconds: windows
# shorter than that count clumps of jitter (measured: a model with a 0.06 ms plan had its
# 2 ms window read 3500/s at a steady 10/s), not load.
MIN_WINDOW_S = 0.1
TRACE_SEED = 12


class TraceUnavailable(Exception):  # noqa: N818 (the condition reason users see)
    """The sample trace cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class Provisioned:
    """The planner's choice for one model, with what the tuner scales from (``reference``:
    the signature, the replicas, one replica's capacity and the sample's envelope)."""

    reference: TunerReference
    cpus: int
    batch: int
    plan: Plan
    slo_ms: float
    p99_ms: float | None
    miss_rate: float
    feasible: bool
    baselines: Mapping[str, Mapping[str, Any]]
    arrivals: int
    evaluations: int

    @property
    def cores(self) -> int:
        return self.cpus * self.reference.replicas

    def record(self) -> ProvisioningRecord:
        """This answer as ``status.provisioning`` holds it."""
        ref = self.reference
        return ProvisioningRecord(
            signature=ref.signature, replicas=ref.replicas, figures=self._figures()
        )

    def _figures(self) -> dict[str, Any]:
        return {
            "cpusPerReplica": self.cpus,
            "batch": self.batch,
            "cores": self.cores,
            "plan": self.plan.label,
            "sloP99Ms": self.slo_ms,
            "simulatedP99Ms": _round(self.p99_ms),
            "simulatedMissRate": round(self.miss_rate, 6),
            "feasible": self.feasible,
            "capacityPerReplica": round(self.reference.capacity, 3),
            "sampleArrivals": self.arrivals,
            "evaluations": self.evaluations,
            "baselines": {k: dict(v) for k, v in self.baselines.items()},
        }


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


def sample_trace(p: AnyPass[Any], slo: Slo) -> tuple[np.ndarray, str]:
    """The sample arrivals and a digest of where they came from (``TraceUnavailable``)."""
    if slo.trace is None:
        assert slo.rate is not None  # a valid spec has one of trace and rate
        rate, cv, duration = slo.rate, slo.cv, slo.duration_seconds
        try:  # the CRD bounds them; a spec that slipped past is a condition, not a crash
            trace = gamma_trace(rate, cv=cv, duration_s=duration, seed=TRACE_SEED)
        except TraceError as exc:
            raise TraceUnavailable(str(exc)) from exc
        if trace.size == 0:
            raise TraceUnavailable(f"a {duration:g} s trace at {rate:g}/s has no arrivals")
        return trace, f"gamma:{rate}:{cv}:{duration}:{TRACE_SEED}"
    name, key = slo.trace
    cm = p.kube.get("configmaps", p.namespace, name)
    if cm is None:
        raise TraceUnavailable(f"trace ConfigMap {name} not found")
    text = (cm.get("data") or {}).get(key)
    if not isinstance(text, str):
        raise TraceUnavailable(f"trace ConfigMap {name} has no key {key!r}")
    if len(text) > MAX_TRACE_BYTES:
        raise TraceUnavailable(f"trace {name}/{key} is larger than {MAX_TRACE_BYTES} bytes")
    try:
        trace = parse_trace(text, origin=f"configmap {name}/{key}")
    except TraceError as exc:
        raise TraceUnavailable(str(exc)) from exc
    if trace.size == 0:
        raise TraceUnavailable(f"trace {name}/{key} has no arrivals")
    return trace, "cm:" + hashlib.sha256(text.encode()).hexdigest()


def plan_for_slo(
    table: Mapping[tuple[int, int], float],
    trace: np.ndarray,
    *,
    slo_ms: float,
    max_cpus: int,
    max_cores: int | None,
    max_batch_delay_ms: float,
    signature: str = "",
) -> Provisioned:
    """Run the planner on ``trace`` and derive the tuner's parameters (pure)."""
    sim = SimSettings(max_batch_delay_ms=max_batch_delay_ms)
    result = provision(
        Planner(table, trace, slo_ms=slo_ms, max_cores=max_cores, max_cpus=max_cpus, sim=sim)
    )
    best = result.best
    planner = Planner(table, trace, slo_ms=slo_ms, max_cpus=max_cpus, sim=sim)
    windows = window_sizes(result.plan.expected_latency_ms / 1000.0, min_window_s=MIN_WINDOW_S)
    reference = TunerReference(
        signature=signature,
        replicas=best.config.replicas,
        capacity=planner.capacity(best.instances),
        windows=tuple(windows),
        planned_rates=tuple(float(r) for r in planned_envelope(trace, windows)),
        growth=growth_curve(trace),
    )
    baselines = {
        name: {
            "replicas": ev.config.replicas,
            "cores": ev.config.cores,
            "simulatedP99Ms": _round(ev.p99_ms),
            "feasible": ev.feasible,
        }
        for name, ev in result.baselines.items()
    }
    return Provisioned(
        reference=reference,
        cpus=best.config.cpus,
        batch=best.config.batch,
        plan=result.plan,
        slo_ms=slo_ms,
        p99_ms=best.p99_ms if math.isfinite(best.p99_ms) else None,
        miss_rate=best.miss_rate,
        feasible=best.feasible,
        baselines=baselines,
        arrivals=int(trace.size),
        evaluations=result.evaluations,
    )


def planned_envelope(trace: np.ndarray, windows: list[float]) -> list[float]:
    """The rates the plan sustains per window: the sample's envelope, where a window longer
    than the sample counts at the sample's own length (its mean rate at most), since the plan
    met the SLO at that rate; dividing by the full window would make the tuner see a steady
    load at the planned rate as several times the plan."""
    if trace.size == 0:  # nothing arrives (a stage no sampled query visits): no envelope
        return [0.0 for _ in windows]
    span = float(trace[-1] - trace[0]) if trace.size > 1 else 0.0
    if span <= 0:
        return [float(trace.size) / w for w in windows]
    clipped = [min(w, span) for w in windows]
    rates = envelope(trace, clipped)
    return [float(r) for r in rates]


ProvisionCache = Lru[str, Provisioned]
"""Planner answers by signature (profile digest, trace, SLO, limits), least recent out."""


def provision_model(
    p: Pass, model: ModelSpec, profile: Profile, cache: ProvisionCache
) -> Provisioned | None:
    """The provisioned configuration for ``model``'s SLO, status and condition updated; None
    (condition, event, phase Failed) when the sample trace cannot be read or planned."""
    slo = model.slo
    assert slo is not None
    try:
        trace, source = sample_trace(p, slo)
    except TraceUnavailable as exc:
        _cannot_plan(p, "TraceUnavailable", str(exc))
        return None
    digest = p.status.profile_digest
    key = {
        "profile": digest
        or hashlib.sha256(json.dumps(sorted(profile.table().items())).encode()).hexdigest(),
        "trace": source,
        "slo": slo.latency_p99_ms,
        "maxCores": slo.max_cores,
        "cpus": model.cpus,
        "delay": model.max_batch_delay_ms,
    }
    signature = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    found = cache.get(signature)
    if found is None:
        cache.misses += 1  # (not get_or_make: a planning error is not cached)
        try:
            found = plan_for_slo(
                profile.table(),
                trace,
                slo_ms=slo.latency_p99_ms,
                max_batch_delay_ms=float(model.max_batch_delay_ms),
                max_cpus=model.cpus,
                max_cores=slo.max_cores,
                signature=signature,
            )
        except ValueError as exc:  # ProvisionError, PlanError, SimulationError: the profile
            _cannot_plan(p, "ProvisionFailed", str(exc))
            return None
        cache.put(signature, found)
    _record(p, found)
    return found


def _cannot_plan(p: Pass, reason: str, message: str) -> None:
    p.status.failed()
    p.result.result = "provision_error"
    message = f"cannot provision for the SLO: {message}"
    if p.status.get("message") != message:
        p.emit("Warning", reason, message)
    p.status.set_message(message)
    p.cond("Provisioned", False, reason, message)
    p.cond("Ready", False, reason, message)


def _record(p: Pass, prov: Provisioned) -> None:
    previous = p.status.provisioning
    p.status.set_provisioning(previous.replanned(prov.record()))
    summary = (
        f"{prov.reference.replicas} x {prov.cpus} CPUs, batch {prov.batch} ({prov.plan.label}): "
        f"simulated P99 {_round(prov.p99_ms)} ms for SLO {prov.slo_ms:g} ms, "
        f"{prov.cores} cores"
    )
    changed = previous.signature != prov.reference.signature
    report_provisioned(p, feasible=prov.feasible, changed=changed, summary=summary)
