"""A pipeline's stages planned for its end-to-end SLO, from the profiles its stage models hold.

Each stage model profiles itself (``spec.cpus`` cores, its own Job and ConfigMap); the
pipeline reads a stage's profile once the stage model's status names a ConfigMap for the
profile key its spec implies, owned by that stage model. When every stage has one, the
pipeline planner (:func:`packrat.plan.pipeline.provision.provision_pipeline`, the one
``packrat provision --pipeline`` runs) simulates the DAG on the sample trace and chooses
every stage's replicas, CPUs per replica and batch. Its answer is cached by everything it
depends on (profile digests, replica limits, edges, trace, SLO, core budget, batch delay,
hop overhead), since one search simulates dozens of configurations; the search is seeded,
so an operator restarted with the same inputs plans the same configuration.

Every HTTP hop costs ``spec.slo.hopOverheadMs`` in the simulation (the client's hop to the
router and each stage's call: :mod:`packrat.plan.pipeline.simulate`). Each stage's tuner
reference is what its pods are planned to see: the envelope of the arrivals that stage saw in
the simulation of the chosen configuration, and one of its replicas' capacity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.ownership import owned_by
from packrat.controller.core.cache import Lru
from packrat.controller.core.context import PipelinePass as Pass
from packrat.controller.pipeline.spec import PipelineObject, StageSpec
from packrat.controller.planning.provisioning import (
    MIN_WINDOW_S,
    TraceUnavailable,
    planned_envelope,
    sample_trace,
)
from packrat.controller.serving import manifests as m
from packrat.plan.envelope import window_sizes
from packrat.plan.pipeline.provision import PipelineProvision, provision_pipeline
from packrat.plan.pipeline.simulate import Pipeline, Stage
from packrat.plan.profile import Profile, ProfileError, parse_profile
from packrat.plan.provision import SimSettings

MAX_PROFILE_BYTES = 4 * 1024 * 1024


class CannotPlan(Exception):  # noqa: N818 (its reason is the condition reason users see)
    """No configuration can be planned; ``reason`` is the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StageProfile:
    profile: Profile
    digest: str


def stage_profile(
    p: Pass, stage: StageSpec, child: Mapping[str, Any] | None
) -> StageProfile | None:
    """The stage model's profile for its current spec, or None while it has none yet."""
    if child is None:
        return None
    pstatus = (child.get("status") or {}).get("profile") or {}
    key = stage.model.profile_key
    cm_name = pstatus.get("configMap")
    if pstatus.get("key") != key or not cm_name:
        return None
    if cm_name != m.profile_object_name(stage.model_name, key):
        return None
    cm = p.kube.get("configmaps", p.namespace, str(cm_name))
    uid = (child.get("metadata") or {}).get("uid")
    if cm is None or not owned_by(cm, name=stage.model_name, uid=uid):
        return None
    text = (cm.get("data") or {}).get(m.PROFILE_FILE, "")
    if not isinstance(text, str) or not text or len(text) > MAX_PROFILE_BYTES:
        return None
    try:
        profile = parse_profile(text, origin=f"configmap {p.namespace}/{cm_name}")
    except (ProfileError, RecursionError, TypeError, ValueError, KeyError, AttributeError):
        return None  # the stage model discards an unreadable profile and measures again
    return StageProfile(profile, hashlib.sha256(text.encode()).hexdigest())


def stage_cpus(stage: StageSpec, profile: Profile) -> int:
    """The largest replica the planner may give the stage: its ``cpus``, within the profile."""
    top = profile.meta.cpus or profile.max_threads
    return min(stage.cpus, top)


PipelinePlans = Lru[str, PipelineProvision]
"""Planner answers by signature, least recent out."""


def plan_pipeline(
    p: Pass,
    pipe: PipelineObject,
    profiles: Mapping[str, StageProfile],
    cache: PipelinePlans,
) -> tuple[PipelineProvision, str]:
    """The planner's configuration and its signature; ``CannotPlan`` when there is none."""
    try:
        trace, source = sample_trace(p, pipe.slo)
    except TraceUnavailable as exc:
        raise CannotPlan("TraceUnavailable", str(exc)) from None
    delay = max(s.max_batch_delay_ms for s in pipe.stages)
    key = {
        "stages": [
            [s.name, profiles[s.name].digest, stage_cpus(s, profiles[s.name].profile)]
            for s in pipe.stages
        ],
        "edges": [[e.src, e.dst, e.fraction] for e in pipe.edges],
        "trace": source,
        "slo": pipe.slo_ms,
        "maxCores": pipe.max_cores,
        "delay": delay,
        "hop": pipe.hop_overhead_ms,
    }
    signature = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    found = cache.get(signature)
    if found is not None:
        return found, signature
    cache.misses += 1
    try:
        pipeline = Pipeline(
            [
                Stage(
                    s.name,
                    profiles[s.name].profile.table(),
                    stage_cpus(s, profiles[s.name].profile),
                )
                for s in pipe.stages
            ],
            pipe.edges,
        )
        found = provision_pipeline(
            pipeline,
            trace,
            slo_ms=pipe.slo_ms,
            max_cores=pipe.max_cores,
            sim=SimSettings(max_batch_delay_ms=delay, overhead_ms=pipe.hop_overhead_ms),
        )
    except ValueError as exc:  # PipelineError, ProvisionError, PlanError, SimulationError
        raise CannotPlan("ProvisionFailed", str(exc)) from None
    cache.put(signature, found)
    return found, signature


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def tuner_reference(prov: PipelineProvision, name: str, replicas: int) -> dict[str, Any]:
    """The stage's tuner reference (``spec.autoscaling.reference``): the windows from its
    plan's latency, the envelope of the arrivals it saw in the simulation, its capacity."""
    latency_s = float(prov.plans[name]["expected_latency_ms"]) / 1000.0
    windows = window_sizes(latency_s, min_window_s=MIN_WINDOW_S)
    rates = planned_envelope(prov.stage_arrivals[name], windows)
    return {
        "replicas": max(1, int(replicas)),
        "capacityPerReplica": round(max(prov.capacity[name], 1e-3), 3),
        "windowsSeconds": [round(w, 4) for w in windows],
        "ratesPerSecond": [round(r, 3) for r in rates],
    }


def stage_configs(prov: PipelineProvision) -> dict[str, dict[str, Any]]:
    """Per stage: replicas, cpusPerReplica, batch, cores, plan label, scale factor, P99 and
    the tuner's reference."""
    out = {}
    for s in prov.to_dict()["stages"]:
        out[s["name"]] = {
            "tunerReference": tuner_reference(prov, s["name"], int(s["replicas"])),
            "scaleFactor": round(float(s["scale_factor"]), 6),
            "replicas": int(s["replicas"]),
            "cpusPerReplica": int(s["cpus_per_replica"]),
            "batch": int(s["batch"]),
            "cores": int(s["cores"]),
            "plan": str(s["plan"]["label"]),
            "simulatedP99Ms": _round(s["stage_p99_ms"]),
        }
    return out


def baselines(prov: PipelineProvision) -> dict[str, dict[str, Any]]:
    return {
        kind: {
            "units": int(b["units"]),
            "cores": int(b["cores"]),
            "simulatedP99Ms": _round(b.get("simulated_p99_ms")),
        }
        for kind, b in prov.baselines.items()
    }
