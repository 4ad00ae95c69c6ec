"""A pipeline's stages planned for its end-to-end SLO, from the profiles its stage models hold.

Each stage model profiles itself (``spec.cpus`` cores, its own Job and ConfigMap); the
pipeline reads a stage's profile once the stage model's status names a ConfigMap for the
profile key its spec implies, owned by that stage model. When every stage has one, the
pipeline planner (:func:`packrat.plan.pipeline.provision.provision_pipeline`, the one
``packrat provision --pipeline`` runs) simulates the DAG on the sample trace and chooses
every stage's replicas, CPUs per replica and batch. The planner runs in a child process with
a time and a memory budget (:mod:`packrat.controller.pipeline.plan_job`), never in the
operator's own. Its answer is keyed by everything it depends on (profile digests, replica
limits, edges, trace, SLO, core budget, batch delay, hop overhead), kept in memory and in a
ConfigMap the pipeline owns (``{pipeline}-pipeline-plan``), so a restarted operator does not
plan again; a run that exceeded its budget is recorded in ``status.planning`` with its key
and not retried until the inputs change.

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
from packrat.controller.core.status import ModelStatus
from packrat.controller.pipeline import manifests as pm
from packrat.controller.pipeline.plan_job import (
    QUEUED,
    PlanBudget,
    PlanJobError,
    PlannedPipeline,
    run_bounded,
)
from packrat.controller.pipeline.spec import PipelineObject, StageSpec
from packrat.controller.planning.provisioning import (
    MIN_WINDOW_S,
    TraceUnavailable,
    planned_envelope,
    sample_trace,
)
from packrat.controller.serving import manifests as m
from packrat.plan.envelope import window_sizes
from packrat.plan.pipeline.provision import PipelineProvision
from packrat.plan.profile import Profile, ProfileError, parse_profile

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
    text: str = ""  # the profile's JSON, as the planner's child process reads it


def stage_profile(
    p: Pass, stage: StageSpec, child: Mapping[str, Any] | None
) -> StageProfile | None:
    """The stage model's profile for its current spec, or None while it has none yet."""
    if child is None:
        return None
    pstatus = ModelStatus(child.get("status")).profile
    key = stage.model.profile_key
    cm_name = pstatus.config_map
    if pstatus.key != key or not cm_name:
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
    return StageProfile(profile, hashlib.sha256(text.encode()).hexdigest(), text)


def stage_cpus(stage: StageSpec, profile: Profile) -> int:
    """The largest replica the planner may give the stage: its ``cpus``, within the profile."""
    top = profile.meta.cpus or profile.max_threads
    return min(stage.cpus, top)


PipelinePlans = Lru[str, PlannedPipeline]
"""Planner answers by signature, least recent out."""


PLAN_KEY = "plan.json"
SIGNATURE_KEY = "signature"


def plan_configmap_name(pipeline: str) -> str:
    return f"{pipeline}-pipeline-plan"


def plan_pipeline(
    p: Pass,
    pipe: PipelineObject,
    profiles: Mapping[str, StageProfile],
    cache: PipelinePlans,
    budget: PlanBudget | None = None,
) -> tuple[PlannedPipeline, str]:
    """The planner's configuration and its signature; ``CannotPlan`` when there is none.

    From memory, else from the pipeline's plan ConfigMap, else planned in a child within
    ``budget`` and persisted. A signature whose planning exceeded its budget fails again at
    once (``status.planning``) instead of being planned again."""
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
    found = cache.get(signature) or _persisted(p, signature)
    if found is not None:
        cache.put(signature, found)
        return found, signature
    failed = p.status.get("planning") or {}
    if failed.get("signature") == signature:
        raise CannotPlan(str(failed.get("reason")), str(failed.get("message")))
    job = {
        "stages": [
            {
                "name": s.name,
                "profile": profiles[s.name].text or profiles[s.name].profile.to_json(),
                "cpus": stage_cpus(s, profiles[s.name].profile),
            }
            for s in pipe.stages
        ],
        "edges": [[e.src, e.dst, e.fraction] for e in pipe.edges],
        "trace": [float(t) for t in trace],
        "sloMs": pipe.slo_ms,
        "maxCores": pipe.max_cores,
        "delayMs": delay,
        "hopMs": pipe.hop_overhead_ms,
    }
    try:
        found = run_bounded(job, budget or PlanBudget())
    except PlanJobError as exc:
        if exc.reason != QUEUED:  # queued: not planned, not a miss
            cache.misses += 1
        if exc.reason == "PlanningBudgetExceeded":  # not again for these inputs
            p.status.set_planning(
                {"signature": signature, "reason": exc.reason, "message": str(exc)}
            )
        raise CannotPlan(exc.reason, str(exc)) from None
    cache.misses += 1
    p.status.set_planning(None)
    _persist(p, signature, found)
    cache.put(signature, found)
    return found, signature


def _ours(p: Pass, obj: Mapping[str, Any]) -> bool:
    return owned_by(obj, name=p.name, uid=p.obj["metadata"].get("uid"), kind=pm.PIPELINE_KIND)


def _persisted(p: Pass, signature: str) -> PlannedPipeline | None:
    """The plan in the pipeline's own plan ConfigMap, when it is for ``signature``."""
    cm = p.kube.get("configmaps", p.namespace, plan_configmap_name(p.name))
    if cm is None or not _ours(p, cm):
        return None
    data = cm.get("data") or {}
    if data.get(SIGNATURE_KEY) != signature:
        return None
    try:
        return PlannedPipeline.from_json(str(data.get(PLAN_KEY, "")))
    except ValueError:
        return None  # edited or broken: planned again, and written again


def _persist(p: Pass, signature: str, planned: PlannedPipeline) -> None:
    name = plan_configmap_name(p.name)
    data = {SIGNATURE_KEY: signature, PLAN_KEY: planned.to_json()}
    current = p.kube.get("configmaps", p.namespace, name)
    if current is None:
        want = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": pm.pipeline_metadata(p.obj, name=name),
            "data": data,
        }
        p.kube.create("configmaps", p.namespace, want)
    elif _ours(p, current):
        p.kube.patch("configmaps", p.namespace, name, {"data": data})
    else:
        p.conflict("ConfigMap", name)


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
