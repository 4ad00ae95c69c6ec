"""One reconcile pass for a PackratPipeline: observe every child, plan, apply the
differences, then (only then) write status.

Order within a pass: the router's objects first (they do not depend on the plan), then the
stage models. Before every stage model has a profile, each is created with the stage's model
spec at batch 1 and 0 replicas: it profiles itself and serves nothing. Once every stage has a
profile, the pipeline planner chooses each stage's replicas, CPUs per replica and batch for
the end-to-end SLO, and the stage models are patched to serve that (each switches to its new
plan the way a PackratModel does). When planning fails later (the trace ConfigMap gone), the
last planned configuration, kept in ``status.stages``, keeps serving.

Level-triggered and idempotent: everything is recomputed from the spec, the children and
``status`` on every pass. An exception (an API error) leaves status exactly as it was:
phase, conditions and observedGeneration change only when a pass completes.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from packrat.controller import pipeline_children as pc
from packrat.controller import pipeline_manifests as pm
from packrat.controller.context import Config, Pass, Result, run_pass
from packrat.controller.kube import KubeApi
from packrat.controller.manifests import PORT
from packrat.controller.model import InvalidSpec
from packrat.controller.ownership import conflict_message
from packrat.controller.pipeline_object import PipelineObject, StageSpec, parse_pipeline
from packrat.controller.pipeline_planning import (
    CannotPlan,
    PipelinePlans,
    baselines,
    plan_pipeline,
    stage_configs,
    stage_profile,
)
from packrat.controller.serving import deployment_ready
from packrat.controller.status import get_condition

PLURAL = "packratpipelines"
PHASES = ("Pending", "Provisioning", "Serving", "Failed")
_STAGE_FIELDS = ("replicas", "cpusPerReplica", "batch")


def stage_ready(model: Mapping[str, Any] | None, target: pc.StageTarget) -> bool:
    """The stage model serves what the pipeline asked: its status observed its current spec,
    it is Ready (no switch under way) on the planned CPUs and batch, every replica ready."""
    if model is None or target.replicas < 1:
        return False
    status = model.get("status") or {}
    generation = (model.get("metadata") or {}).get("generation")
    if generation is not None and status.get("observedGeneration") != generation:
        return False
    if status.get("phase") != "Ready" or status.get("switch"):
        return False
    serving = status.get("servingSpec") or {}
    plan = status.get("plan") or {}
    if int(serving.get("cpus") or 0) != target.serving_cpus:
        return False
    if int(plan.get("batch") or 0) != target.batch:
        return False
    return int(status.get("readyReplicas") or 0) >= target.replicas


def stage_target(stage: StageSpec, want: Mapping[str, Any] | None) -> pc.StageTarget:
    """What the stage model should serve: the plan's configuration (within the stage's
    current cpus and profiled batches, should the last plan predate a spec change), or,
    before any plan, batch 1 on no replica (it profiles and serves nothing)."""
    if want is None:
        return pc.StageTarget(batch=1, replicas=0, serving_cpus=None)
    batch = min(int(want["batch"]), int(stage.model["profiling"]["maxBatch"]))
    cpus = min(int(want["cpusPerReplica"]), stage.cpus)
    return pc.StageTarget(batch=batch, replicas=int(want["replicas"]), serving_cpus=cpus)


class PipelineReconciler:
    """Runs passes for PackratPipeline objects (one at a time per object: the caller's job)."""

    def __init__(self, kube: KubeApi, *, config: Config | None = None) -> None:
        self.kube = kube
        self.config = config or Config()
        self.plans = PipelinePlans()

    def reconcile(
        self,
        namespace: str,
        name: str,
        *,
        now: datetime.datetime | None = None,
        measured_p99_ms: float | None = None,
    ) -> Result:
        """One pass; ``measured_p99_ms``: the router pods' end-to-end P99, read before it."""

        def step(p: Pass) -> None:
            self._pass(p, measured_p99_ms)
            self._report_conflicts(p)

        return run_pass(self.kube, self.config, PLURAL, namespace, name, step=step, now=now)

    # -- the pass ------------------------------------------------------------------------------
    def _pass(self, p: Pass, measured_p99_ms: float | None) -> None:
        try:
            pipe = parse_pipeline(p.obj)
        except InvalidSpec as exc:
            self._fail(p, "invalid", "InvalidSpec", "; ".join(exc.errors))
            return
        children = pc.observe(p, pipe)
        pc.find_conflicts(p, pipe, children)
        if p.conflicts:
            self._fail(
                p,
                "conflict",
                "OwnershipConflict",
                conflict_message(p.conflicts, owner=pm.PIPELINE_KIND),
            )
            p.result.waiting = True  # a foreign object's removal sends us no event
            return
        p.status.pop("message", None)  # set again below if it still applies
        pc.remove_leftovers(p, children)
        router = pc.ensure_router(p, children, image=self.config.image)
        p.status["endpoint"] = {"service": f"{p.name}.{p.namespace}.svc", "port": PORT}

        profiles = {}
        for stage in pipe.stages:
            found = stage_profile(p, stage, children.models[stage.name], image=self.config.image)
            if found is not None:
                profiles[stage.name] = found
        configs = self._plan(
            p, pipe, profiles, previous_message=(p.obj.get("status") or {}).get("message")
        )

        targets: dict[str, pc.StageTarget] = {}
        settled: dict[str, bool] = {}
        for stage in pipe.stages:
            targets[stage.name] = target = stage_target(stage, configs.get(stage.name))
            current = children.models[stage.name]
            settled[stage.name] = pc.ensure_stage(p, pipe, stage.name, current, target)
        if measured_p99_ms is not None:
            p.status["measuredP99Ms"] = measured_p99_ms
        if "measuredP99Ms" in p.status:  # the measured P99, else the simulated one, decides
            p.status["sloMet"] = bool(p.status["measuredP99Ms"] <= pipe.slo_ms)
        self._status(
            p,
            pipe=pipe,
            children=children,
            configs=configs,
            targets={n: t for n, t in targets.items() if settled[n]},
            router=router,
            missing=sorted(s.name for s in pipe.stages if s.name not in profiles),
        )

    def _plan(
        self,
        p: Pass,
        pipe: PipelineObject,
        profiles: Mapping[str, Any],
        *,
        previous_message: str | None,
    ) -> dict[str, dict[str, Any]]:
        """Each stage's planned configuration: this pass's plan when every stage has a
        profile and planning succeeds, else the last one in status (possibly none)."""
        previous = {
            s["name"]: {k: s[k] for k in (*_STAGE_FIELDS, "plan") if k in s}
            for s in p.status.get("stages") or []
            if all(k in s for k in _STAGE_FIELDS)
        }
        if not all(previous.get(s.name) for s in pipe.stages):
            previous = {}
        if len(profiles) < len(pipe.stages):
            return previous
        try:
            prov, signature = plan_pipeline(p, pipe, profiles, self.plans)
        except CannotPlan as exc:
            message = f"cannot provision the pipeline for its SLO: {exc}"
            if previous_message != message:
                p.emit("Warning", exc.reason, message)
            p.status["message"] = message
            p.cond("Provisioned", False, exc.reason, message)
            if not previous:
                p.result.phase = "Failed"
                p.result.result = "provision_error"
            return previous
        configs = stage_configs(prov)
        summary = ", ".join(
            f"{n} {c['replicas']}x{c['cpusPerReplica']} CPUs b{c['batch']}"
            for n, c in configs.items()
        )
        summary += (
            f": simulated P99 {_ms(prov.best.p99_ms)} ms for SLO {pipe.slo_ms:g} ms, "
            f"{prov.best.cores} cores"
        )
        changed = p.status.get("planSignature") != signature
        if prov.feasible:
            if changed:
                p.emit("Normal", "Provisioned", summary)
            p.cond("Provisioned", True, "Feasible", summary)
        else:
            summary = f"SLO infeasible, serving the lowest simulated P99: {summary}"
            if changed:
                p.emit("Warning", "SloInfeasible", summary)
            p.cond("Provisioned", False, "Infeasible", summary)
        p.status.update(
            planSignature=signature,
            cores=prov.best.cores,
            simulatedP99Ms=_ms(prov.best.p99_ms),
            sloMet=bool(prov.best.p99_ms <= pipe.slo_ms),
            baselines=baselines(prov),
        )
        if p.status["simulatedP99Ms"] is None:
            p.status.pop("simulatedP99Ms")
        return configs

    def _status(
        self,
        p: Pass,
        *,
        pipe: PipelineObject,
        children: pc.PipelineChildren,
        configs: Mapping[str, Mapping[str, Any]],
        targets: Mapping[str, pc.StageTarget],
        router: Mapping[str, Any] | None,
        missing: list[str],
    ) -> None:
        stages, waiting_on = [], []
        previous = {s.get("name"): s for s in p.status.get("stages") or []}
        for stage in pipe.stages:
            model = children.models[stage.name]
            mstatus = (model or {}).get("status") or {}
            entry: dict[str, Any] = {"name": stage.name, "model": stage.model_name}
            entry.update({**previous.get(stage.name, {}), **configs.get(stage.name, {})})
            entry.update(name=stage.name, model=stage.model_name)
            entry["phase"] = str(mstatus.get("phase") or "Pending")
            entry["readyReplicas"] = int(mstatus.get("readyReplicas") or 0)
            stages.append(entry)
            target = targets.get(stage.name)  # absent: patched by this pass
            if target is None or not stage_ready(model, target):
                waiting_on.append(stage.name)
        p.status["stages"] = stages
        replicas = pc.ROUTER_REPLICAS
        ready_replicas = int(((router or {}).get("status") or {}).get("readyReplicas") or 0)
        p.status["router"] = {"replicas": replicas, "readyReplicas": ready_replicas}
        router_ok = deployment_ready(router, replicas)
        if p.result.phase == "Failed":
            p.cond("Ready", False, "ProvisionFailed", p.status.get("message", ""))
            return
        was_ready = p.status.get("phase") == "Serving"
        if not waiting_on and router_ok:
            message = f"{len(stages)} stages and the router serve at {p.name}.{p.namespace}.svc"
            p.result.phase = "Serving"
            if not was_ready:
                p.emit("Normal", "Ready", message)
            p.cond("Ready", True, "Serving", message)
            return
        p.result.waiting = True
        if missing:
            p.result.phase = "Pending"
            reason, message = "Profiling", f"waiting for the profiles of {', '.join(missing)}"
            if "Provisioned" not in {c.get("type") for c in p.status.get("conditions") or []}:
                p.cond("Provisioned", False, "Profiling", message)
        else:
            p.result.phase = "Provisioning"
            parts = [f"stages {', '.join(waiting_on)}"] if waiting_on else []
            if not router_ok:
                parts.append(f"router {ready_replicas}/{replicas} ready")
            reason, message = "Deploying", "waiting for " + " and ".join(parts)
        p.cond("Ready", False, reason, message)

    # -- failures ------------------------------------------------------------------------------
    def _fail(self, p: Pass, result: str, reason: str, message: str) -> None:
        p.result.phase = "Failed"
        p.result.result = result
        if p.status.get("message") != message and reason != "OwnershipConflict":
            p.emit("Warning", reason, message)
        p.status["message"] = message
        p.cond("Ready", False, reason, message)

    def _report_conflicts(self, p: Pass) -> None:
        previous = get_condition(p.status.get("conditions"), "OwnershipConflict") or {}
        if p.conflicts:
            message = conflict_message(p.conflicts, owner=pm.PIPELINE_KIND)
            if previous.get("status") != "True" or previous.get("message") != message:
                p.emit("Warning", "OwnershipConflict", message)
            p.cond("OwnershipConflict", True, "NotOwned", message)
        elif previous.get("status") == "True":
            p.cond("OwnershipConflict", False, "Resolved", "")


def _ms(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None
