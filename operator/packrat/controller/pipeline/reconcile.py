"""One reconcile pass for a PackratPipeline: observe every child, plan, apply the
differences, then (only then) write status.

Order within a pass: the router's objects first (they do not depend on the plan), then the
stage models. Before every stage model has a profile, each is created with the stage's model
spec at batch 1, 0 replicas and ``packrat.dev/profile-only``: it profiles itself and deploys
nothing. Once every stage has a profile, the pipeline planner chooses each stage's replicas,
CPUs per replica and batch for the end-to-end SLO, and the stage models are patched to serve
that (the first Deployment of each is the planned one; a later plan switches the way a
PackratModel does). When planning fails later (the trace ConfigMap gone), the last planned
configuration, kept in ``status.stages``, keeps serving.

With ``spec.autoscaling`` each stage model gets it too: in ``envelope`` mode with its tuner
reference (the envelope of the arrivals the stage saw in the plan's simulation), so its own
tuner (:mod:`packrat.controller.planning.autoscale`) scales its replicas from the arrivals its pods
see; in ``external`` mode its ``spec.replicas`` is left to an HPA or KEDA once it serves.
Each stage's tuned count and last scaling decision are mirrored into ``status.stages`` and
each change is an Event on the pipeline.

Level-triggered and idempotent: everything is recomputed from the spec, the children and
``status`` on every pass. An exception (an API error) leaves status exactly as it was:
phase, conditions and observedGeneration change only when a pass completes.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from packrat.controller.api import crd
from packrat.controller.api.kube import KubeApi
from packrat.controller.api.ownership import conflict_message
from packrat.controller.core.context import Config, Result, report_provisioned, run_pass
from packrat.controller.core.context import PipelinePass as Pass
from packrat.controller.core.model import InvalidSpec
from packrat.controller.core.status import ModelStatus, PipelineStatus
from packrat.controller.pipeline import children as pc
from packrat.controller.pipeline import manifests as pm
from packrat.controller.pipeline.fractions import feed_back
from packrat.controller.pipeline.latency import Measured
from packrat.controller.pipeline.plan_job import QUEUED, PlanBudget
from packrat.controller.pipeline.planning import (
    CannotPlan,
    PipelinePlans,
    plan_pipeline,
    stage_profile,
)
from packrat.controller.pipeline.spec import PipelineObject, StageSpec, parse_pipeline
from packrat.controller.serving.manifests import PORT
from packrat.controller.serving.slots import deployment_ready
from packrat.plan.optimizer import Plan

PLURAL = crd.PIPELINE_PLURAL
PHASES = ("Pending", "Provisioning", "Serving", "Failed")
_STAGE_FIELDS = ("replicas", "cpusPerReplica", "batch")
_KEPT_FIELDS = (*_STAGE_FIELDS, "plan", "tunerReference")


def stage_ready(model: Mapping[str, Any] | None, target: pc.StageTarget) -> bool:
    """The stage model serves what the pipeline asked: its status observed its current spec,
    it is Ready (no switch under way) on the planned CPUs and batch, every replica ready."""
    if model is None or target.replicas < 1:
        return False
    status = ModelStatus(model.get("status"))
    generation = (model.get("metadata") or {}).get("generation")
    if generation is not None and status.get("observedGeneration") != generation:
        return False
    if status.get("phase") != "Ready" or status.switch is not None:
        return False
    if served_plan(status, target) is None:
        return False
    replicas = target.replicas
    if target.autoscaling is not None:  # the count its tuner or scaler chose
        replicas = int(status.get("replicas") or replicas)
    return int(status.get("readyReplicas") or 0) >= replicas


def served_plan(status: ModelStatus, target: pc.StageTarget) -> Plan | None:
    """The plan the stage model's active slot serves when it serves the pipeline's planned
    CPUs and batch (None before, or while it still serves another configuration).

    Its instances may differ from the pipeline planner's plan for that batch: a stage model
    serves the monotone plan (a larger batch's instances when its profile says they are
    faster, :mod:`packrat.plan.padding`) and never one its verification measured slower
    than fat (:mod:`packrat.controller.profiling.verified`)."""
    plan = status.served_plan
    if int(status.serving_spec_doc.get("cpus") or 0) != target.serving_cpus:
        return None
    return plan if plan is not None and plan.batch == target.batch else None


def stage_autoscaling(
    pipe: PipelineObject, want: Mapping[str, Any] | None, stage: str | None = None
) -> dict[str, Any] | None:
    """The stage model's ``spec.autoscaling``: the pipeline's, with the stage's tuner
    reference in envelope mode (none before a plan that has one); a downstream ``stage``
    is tuned from the pipeline's ingress times its scale factor (``ingress``)."""
    if pipe.autoscaling is None or want is None:
        return None
    auto = dict(pipe.autoscaling)
    if auto["mode"] == "envelope":
        ref = want.get("tunerReference")
        if not isinstance(ref, Mapping):
            return None
        auto["reference"] = dict(ref)
        factor = want.get("scaleFactor")
        downstream = any(e.dst == stage for e in pipe.edges)
        if downstream and isinstance(factor, int | float) and 0 < factor <= 1:
            auto["ingress"] = {"service": pipe.name, "scaleFactor": float(factor)}
    return auto


def stage_target(
    pipe: PipelineObject, stage: StageSpec, want: Mapping[str, Any] | None
) -> pc.StageTarget:
    """What the stage model should serve: the plan's configuration (within the stage's
    current cpus and profiled batches, should the last plan predate a spec change), or,
    before any plan, batch 1 on no replica (it profiles and deploys nothing)."""
    if want is None:
        return pc.StageTarget(batch=1, replicas=0, serving_cpus=None)
    batch = min(int(want["batch"]), stage.model.profiling.max_batch)
    cpus = min(int(want["cpusPerReplica"]), stage.cpus)
    return pc.StageTarget(
        batch=batch,
        replicas=int(want["replicas"]),
        serving_cpus=cpus,
        autoscaling=stage_autoscaling(pipe, want, stage.name),
    )


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
        measured: Measured | None = None,
    ) -> Result:
        """One pass; ``measured``: the router pods' end-to-end latency over the trailing
        window, read before it (None: not read, status keeps what it had)."""

        def step(p: Pass) -> None:
            self._pass(p, measured)
            p.report_conflicts(pm.PIPELINE_KIND)

        return run_pass(
            self.kube,
            self.config,
            PLURAL,
            namespace,
            name,
            status=PipelineStatus,
            step=step,
            now=now,
        )

    # -- the pass ------------------------------------------------------------------------------
    def _conflicted(self, p: Pass) -> bool:
        """Whether an object under one of our names is not ours (reported: the pass stops)."""
        if not p.conflicts:
            return False
        message = conflict_message(p.conflicts, owner=pm.PIPELINE_KIND)
        self._fail(p, "conflict", "OwnershipConflict", message)
        p.result.in_progress()  # a foreign object's removal sends us no event
        return True

    def _pass(self, p: Pass, measured: Measured | None) -> None:
        try:
            pipe = parse_pipeline(p.obj, default_image=self.config.image)
        except InvalidSpec as exc:
            self._fail(p, "invalid", "InvalidSpec", "; ".join(exc.errors))
            return
        children = pc.observe(p, pipe)
        pc.find_conflicts(p, pipe, children)
        if self._conflicted(p):
            return
        p.status.set_message(None)  # set again below if it still applies
        pc.remove_leftovers(p, children)
        router = pc.ensure_router(p, pipe, children, image=self.config.image)
        if self._conflicted(p):  # the routers' token Secret is not ours
            return
        p.status.set_endpoint(p.name, p.namespace, PORT)

        profiles = {}
        for stage in pipe.stages:
            found = stage_profile(p, stage, children.models[stage.name])
            if found is not None:
                profiles[stage.name] = found
        planned = feed_back(p, pipe, measured)  # the measured edge fractions, once known
        configs = self._plan(
            p, planned, profiles, previous_message=(p.obj.get("status") or {}).get("message")
        )

        targets: dict[str, pc.StageTarget] = {}
        settled: dict[str, bool] = {}
        for stage in pipe.stages:
            targets[stage.name] = target = stage_target(pipe, stage, configs.get(stage.name))
            current = children.models[stage.name]
            settled[stage.name] = pc.ensure_stage(p, pipe, stage.name, current, target)
        if measured is not None:  # the trailing window's P99, or none with too few queries
            p.status.set_measured(measured.queries, measured.p99_ms)
        p.status.judge_slo(pipe.slo_ms)  # the measured P99, else the simulated one, decides
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
            s["name"]: {k: s[k] for k in _KEPT_FIELDS if k in s}
            for s in p.status.get("stages") or []
            if all(k in s for k in _STAGE_FIELDS)
        }
        if not all(previous.get(s.name) for s in pipe.stages):
            previous = {}
        if len(profiles) < len(pipe.stages):
            return previous
        try:
            budget = PlanBudget(
                seconds=self.config.pipeline_plan_seconds,
                memory_mib=self.config.pipeline_plan_memory_mib,
            )
            planned, signature = plan_pipeline(p, pipe, profiles, self.plans, budget)
        except CannotPlan as exc:
            if exc.reason == QUEUED:  # every planning child is busy: its turn comes
                p.result.in_progress()
                p.cond("Provisioned", False, QUEUED, str(exc))
                return previous
            message = f"cannot provision the pipeline for its SLO: {exc}"
            if previous_message != message:
                p.emit("Warning", exc.reason, message)
            p.status.set_message(message)
            p.cond("Provisioned", False, exc.reason, message)
            if not previous:
                p.status.failed()
                p.result.result = "provision_error"
            return previous
        configs = planned.configs
        summary = ", ".join(
            f"{n} {c['replicas']}x{c['cpusPerReplica']} CPUs b{c['batch']}"
            for n, c in configs.items()
        )
        summary += (
            f": simulated P99 {_ms(planned.p99_ms)} ms for SLO {pipe.slo_ms:g} ms, "
            f"{planned.cores} cores"
        )
        changed = p.status.get("planSignature") != signature
        report_provisioned(p, feasible=planned.feasible, changed=changed, summary=summary)
        p.status.set_plan(
            signature=signature,
            cores=planned.cores,
            simulated_p99_ms=_ms(planned.p99_ms),
            slo_met=planned.p99_ms is not None and planned.p99_ms <= pipe.slo_ms,
            baselines=planned.baselines,
        )
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
            mstatus = ModelStatus((model or {}).get("status"))
            entry: dict[str, Any] = {"name": stage.name, "model": stage.model_name}
            entry.update({**previous.get(stage.name, {}), **configs.get(stage.name, {})})
            entry.update(name=stage.name, model=stage.model_name)
            entry["phase"] = str(mstatus.get("phase") or "Pending")
            entry["readyReplicas"] = int(mstatus.get("readyReplicas") or 0)
            mirror_autoscaling(p, entry, mstatus, tuned=pipe.autoscaling is not None)
            target = targets.get(stage.name)  # absent: patched by this pass
            served = served_plan(mstatus, target) if target is not None else None
            if served is not None:  # what its replicas run (until then: what was planned)
                entry["plan"] = served.label
            stages.append(entry)
            if target is None or not stage_ready(model, target):
                waiting_on.append(stage.name)
        p.status.set_stages(stages)
        replicas = pc.ROUTER_REPLICAS
        ready_replicas = int(((router or {}).get("status") or {}).get("readyReplicas") or 0)
        p.status.set_router(replicas, ready_replicas)
        router_ok = deployment_ready(router, replicas)
        if p.status.phase == "Failed":
            p.cond("Ready", False, "ProvisionFailed", p.status.get("message", ""))
            return
        was_ready = p.status.get("phase") == "Serving"
        if not waiting_on and router_ok:
            message = f"{len(stages)} stages and the router serve at {p.name}.{p.namespace}.svc"
            p.status.serving()
            if not was_ready:
                p.emit("Normal", "Ready", message)
            p.cond("Ready", True, "Serving", message)
            return
        p.result.in_progress()
        if missing:
            p.status.waiting(missing_profiles=True)
            reason, message = "Profiling", f"waiting for the profiles of {', '.join(missing)}"
            if "Provisioned" not in {c.get("type") for c in p.status.get("conditions") or []}:
                p.cond("Provisioned", False, "Profiling", message)
        else:
            p.status.waiting(missing_profiles=False)
            parts = [f"stages {', '.join(waiting_on)}"] if waiting_on else []
            if not router_ok:
                parts.append(f"router {ready_replicas}/{replicas} ready")
            reason, message = "Deploying", "waiting for " + " and ".join(parts)
        p.cond("Ready", False, reason, message)

    # -- failures ------------------------------------------------------------------------------
    def _fail(self, p: Pass, result: str, reason: str, message: str) -> None:
        p.status.failed()
        p.result.result = result
        if p.status.get("message") != message and reason != "OwnershipConflict":
            p.emit("Warning", reason, message)
        p.status.set_message(message)
        p.cond("Ready", False, reason, message)


def mirror_autoscaling(
    p: Pass, entry: dict[str, Any], mstatus: ModelStatus, *, tuned: bool
) -> None:
    """Copy the stage model's serving count and last scaling decision into the stage's
    status entry; a new scaling decision is an Event on the pipeline too."""
    before = entry.pop("autoscaling", None) or {}
    if not tuned:
        return
    last = mstatus.autoscaling.last_scale
    mirrored: dict[str, Any] = {}
    if isinstance(mstatus.get("replicas"), int):
        mirrored["replicas"] = int(mstatus["replicas"])
    if last is not None:
        mirrored["lastScale"] = {
            k: last[k] for k in ("time", "action", "replicas", "previous", "reason") if k in last
        }
        seen = (before.get("lastScale") or {}).get("time")
        if seen != last.get("time") and "replicas" in last and "previous" in last:
            p.emit(
                "Normal",
                "StageScaled",
                f"stage {entry['name']}: {last['previous']} -> {last['replicas']} replicas: "
                f"{last.get('reason', '')}",
            )
    if mirrored:
        entry["autoscaling"] = mirrored


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None and math.isfinite(value) else None
