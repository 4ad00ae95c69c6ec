"""One reconcile pass for a PackratModel: observe every child, compute what should be, apply
the differences, then (only then) write status.

Order within a pass: serving repairs first (the Service and the active slot, from the last
good configuration in status), so nothing that serves ever waits on profiling; then the
profile, the plan, and the switch to a new plan. Every step is idempotent and all progress
lives in ``status``, so a pass can be repeated, interrupted or run by a restarted operator.
An exception (an API error) leaves status exactly as it was: phase, conditions and
observedGeneration change only when a pass completes.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.api.ownership import conflict_message, owned_by
from packrat.controller.core.context import Config, Result, run_pass
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import InvalidSpec, ModelSpec, Parsed, parse_again
from packrat.controller.core.overrides import refused_by_policy
from packrat.controller.core.plans import keep_served
from packrat.controller.core.slo_spec import TunerReference
from packrat.controller.core.status import ModelStatus, Stage
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning import autoscale as asc
from packrat.controller.planning.batching import (
    batch_to_plan,
    observe_batch,
    plan_capacity,
    slo_batch,
    slo_floor,
    slo_top,
)
from packrat.controller.planning.provisioning import ProvisionCache, provision_model
from packrat.controller.pool.member import serve_in_pool
from packrat.controller.profiling import verified
from packrat.controller.profiling.profile import ensure_profile
from packrat.controller.profiling.storage_check import resolve_version
from packrat.controller.serving import manifests as m
from packrat.controller.serving.protection import release_orphans
from packrat.controller.serving.service import ensure_service
from packrat.controller.serving.slots import Rendering, ensure_deployment, last_good, scale, steady
from packrat.controller.switch.active_passive import abort, advance_switch, start_switch
from packrat.controller.switch.canary import CanaryClient, reconcile_canary
from packrat.controller.switch.failover import lost_active, release_unneeded
from packrat.controller.switch.inpod import Pending, PodClient, switch_in_pod
from packrat.controller.switch.plan_poster import switchable
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.padding import padded_plan, padding_horizon
from packrat.plan.profile import Profile

__all__ = ["Config", "Reconciler", "Result"]

logger = logging.getLogger(__name__)

Estimates = ab.EstimateSource


@dataclass
class Children:
    """Every object a model owns (or would), read at the start of the pass."""

    service: dict[str, Any] | None
    deployments: dict[str, dict[str, Any] | None]
    configmap: dict[str, Any] | None
    jobs: list[dict[str, Any]]


@dataclass(frozen=True)
class _Planned:
    """What a pass planned: the rendering to serve, on how many replicas, and what the
    steady state needs of the planning (the optimizer, the replica reference, the plan
    refused for being slower than fat)."""

    desired: Rendering
    replicas: int
    profile: Profile
    optimizer: Optimizer
    reference: TunerReference | None
    slower: Plan | None
    batch_floor: int | None = None  # with an SLO and autoBatch: the planner's batch
    batch_top: int | None = None  # and the largest batch whose plan meets the SLO


def observe(kube: KubeApi, namespace: str, name: str, model: ModelSpec | None) -> Children:
    deployments = {
        slot: kube.get("deployments", namespace, m.deployment_name(name, slot)) for slot in m.SLOTS
    }
    service = kube.get("services", namespace, name)
    if model is None:
        return Children(service, deployments, None, [])
    configmap = kube.get("configmaps", namespace, m.profile_object_name(name, model.profile_key))
    labels = {m.LABEL_MODEL: name, "app.kubernetes.io/name": m.PROFILING_APP}
    jobs = kube.list("jobs", namespace, labels=labels)
    return Children(service, deployments, configmap, jobs)


class Reconciler:
    """Runs passes for PackratModel objects (one at a time per object: the caller's job)."""

    def __init__(
        self,
        kube: KubeApi,
        *,
        config: Config | None = None,
        estimates: Estimates | None = None,
        pods: PodClient | None = None,
        canary: CanaryClient | None = None,
    ) -> None:
        """``pods``: how to reach the serving pods for the in-pod switch (None: every plan
        change takes the Deployment switch); ``canary``: for spec.canary (None: ignored)."""
        self.kube = kube
        self.config = config or Config()
        self.estimates = estimates
        self.pods = pods
        self.canary = canary
        self.optimizers = ab.OptimizerCache()
        self.provisions = ProvisionCache()
        self.tuners = asc.Tuners()

    def reconcile(
        self,
        namespace: str,
        name: str,
        *,
        now: datetime.datetime | None = None,
        reading: ab.Reading | None = None,
        arrivals: asc.Arrivals | None = None,
        known: Parsed | None = None,
    ) -> Result:
        """One pass; ``known``: the spec the caller parsed already (the daemon's, from the
        watch event's body), used when the object read is what it was parsed from."""

        def step(p: Pass) -> None:
            self._pass(p, reading, arrivals, known)
            p.report_conflicts()

        return run_pass(
            self.kube,
            self.config,
            "packratmodels",
            namespace,
            name,
            status=ModelStatus,
            step=step,
            now=now,
            # a gone model's held Deployments are let go: no delete hangs on us
            on_gone=lambda: release_orphans(self.kube, namespace, name, live=None),
        )

    def release_orphans(self, namespace: str, name: str) -> list[str]:
        """Let go the serving Deployments of ``name`` that no live model owns (a deleted
        Deployment seen while no pass of its model runs: the model is gone or being deleted,
        or a pass created it while the model's delete released the others)."""
        obj = self.kube.get("packratmodels", namespace, name)
        if obj is not None and obj.get("metadata", {}).get("deletionTimestamp"):
            obj = None
        return release_orphans(self.kube, namespace, name, live=obj)

    # -- the pass ------------------------------------------------------------------------------
    def _pass(
        self,
        p: Pass,
        reading: ab.Reading | None,
        arrivals: asc.Arrivals | None,
        known: Parsed | None = None,
    ) -> None:
        model, invalid, refused, unavailable = self._read_model(p, known)
        children = observe(self.kube, p.namespace, p.name, model)
        if model is not None and model.pool:
            if serve_in_pool(p, model, children.service, self.optimizers):
                return  # served by its pool (controller/pool/member.py)
        elif model is not None:
            p.status.set_pool_plan(None)  # a model out of its pool

        # 1. serving repairs, from the last good configuration, before anything else
        repaired = self._repair_serving(p, model, children)
        if repaired is None:
            return  # serving from the deleted slot's pods until the other slot is ready
        good, replicas, active_dep = repaired

        if invalid is not None or model is None:
            reason = "PolicyRefused" if refused else "InvalidSpec"
            self._invalid(p, invalid.errors if invalid else ["spec unreadable"], reason=reason)
            return
        if self._foreign(p, children) or unavailable:
            return

        # 2. profile
        profile = ensure_profile(p, model, configmap=children.configmap, jobs=children.jobs)
        if profile is None:
            return
        if model.profile_only and good is None:  # a pipeline's stage before its plan
            p.status.awaiting_plan()
            message = "profiled; waiting for the pipeline's plan (packrat.dev/profile-only)"
            p.cond("Ready", False, "AwaitingPipelinePlan", message)
            return

        # 3. plan (with an SLO: replicas, CPUs per replica and batch from the provisioning)
        planned = self._plan(p, model, profile, replicas=replicas)
        if planned is None:
            return

        # 4. serving slots and the switch
        if good is None:
            self._first_deploy(p, children, desired=planned.desired, replicas=planned.replicas)
            return
        if self._switching(p, children, model, desired=planned.desired, replicas=planned.replicas):
            return
        self._serve_steadily(
            p,
            model,
            planned,
            children=children,
            active_dep=active_dep,
            reading=reading,
            arrivals=arrivals,
        )

    def _read_model(
        self, p: Pass, known: Parsed | None = None
    ) -> tuple[ModelSpec | None, InvalidSpec | None, list[str], bool]:
        """The typed spec, or why there is none (invalid, or refused by the platform's
        allow-lists); whether a storageUri model's store is unavailable."""
        try:
            image = self.config.image
            model: ModelSpec | None = parse_again(p.obj, default_image=image, known=known)
            invalid: InvalidSpec | None = None
        except InvalidSpec as exc:
            model, invalid = None, exc
        refused = self._refused(model)
        if refused:  # outside the platform's allow-lists: as invalid, with its own reason
            model, invalid = None, InvalidSpec(refused)
        unavailable = False
        if model is not None:  # a storageUri model's version (ETag) is part of its identity
            resolved = resolve_version(p, model)
            unavailable, model = resolved is None, resolved or model
        return model, invalid, refused, unavailable

    def _repair_serving(
        self, p: Pass, model: ModelSpec | None, children: Children
    ) -> tuple[Rendering | None, int, dict[str, Any] | None] | None:
        """Keep the last good configuration serving (its Service and active slot): the last
        good rendering, the replicas to serve and the active Deployment; None while the
        active slot was lost and the other one takes over."""
        status = p.status
        good = last_good(p, fallback=model)
        replicas = model.replicas if model else (good.spec.replicas if good else 1)
        if model is not None:
            replicas = asc.serving_replicas(model, status)
        active_dep: dict[str, Any] | None = None
        active_slot = str(status["activeSlot"]) if good is not None else None
        release_unneeded(p, children.deployments, active=active_slot)
        if good is not None:
            active = str(status["activeSlot"])
            status.keep_serving_spec(good.spec.stored_spec())
            status.set_endpoint(p.name, p.namespace, m.PORT)
            deps, svc = children.deployments, children.service
            if lost_active(p, deps, svc, good=good, replicas=replicas):
                return None
            ensure_service(p, svc, slot=active)
            active_dep = ensure_deployment(
                p, deps[active], slot=active, rendering=good, replicas=replicas
            )
        return good, replicas, active_dep

    def _plan(
        self, p: Pass, model: ModelSpec, profile: Profile, *, replicas: int
    ) -> _Planned | None:
        """The plan to serve (never one measured slower than fat) on the serving size; None
        when there is none yet (an SLO being provisioned) or none at all (PlanFailed)."""
        status = p.status
        batch = batch_to_plan(model, status)
        auto = model.auto
        max_batch = max(batch, auto.max) if auto else batch
        serving = model
        if model.serving_cpus is not None:  # a pipeline's stage: its planner chose the size
            serving = model.on_cpus(model.serving_cpus)
        prov = None
        if model.slo is not None:
            prov = provision_model(p, model, profile, self.provisions)
            if prov is None:
                return None
            batch, max_batch = slo_batch(model, status, prov.batch)
            serving = model.on_cpus(prov.cpus)
            replicas = asc.serving_replicas(model, status, prov.reference)
        try:
            optimizer = self.optimizers.optimizer(
                profile,
                digest=status.profile_digest,
                cpus=serving.cpus,
                max_batch=padding_horizon(max_batch),  # room for a faster, larger plan
            )
            floor = slo_floor(model, prov.batch) if prov is not None and auto else None
            top: int | None = None
            if prov is not None and floor is not None:  # never above the SLO's top, even
                top = slo_top(model, optimizer, profile, floor=floor, slo_ms=prov.slo_ms)
                batch = min(batch, top)  # a batch chosen before the SLO was made tighter
            plan = keep_served(status.served_plan, padded_plan(optimizer, batch))
            plan, slower = verified.guard(p, plan, profile)  # never serve a plan slower than fat
        except PlanError as exc:
            status.failed()
            p.result.result = "plan_error"
            message = f"no plan for cpus={model.cpus} batch={batch}: {exc}"
            if status.get("message") != message:
                p.emit("Warning", "PlanFailed", message)
            status.set_message(message)
            p.cond("Planned", False, "PlanFailed", message)
            p.cond("Ready", False, "PlanFailed", message)
            return None
        p.result.plan = plan
        p.cond("Planned", True, "Planned", f"plan {plan.label}")
        desired = Rendering(spec=serving, plan=plan, serving_hash=serving.serving_hash(plan))
        return _Planned(
            desired=desired,
            replicas=replicas,
            profile=profile,
            optimizer=optimizer,
            reference=prov.reference if prov is not None else model.reference,
            slower=slower,
            batch_floor=floor,
            batch_top=top,
        )

    def _serve_steadily(
        self,
        p: Pass,
        model: ModelSpec,
        planned: _Planned,
        *,
        children: Children,
        active_dep: dict[str, Any] | None,
        reading: ab.Reading | None,
        arrivals: asc.Arrivals | None,
    ) -> None:
        """No switch under way: the passive slot at zero, the active one at the tuned
        replicas, the canary, published measurements and scale, the batch estimate read."""
        status = p.status
        replicas, profile, plan = planned.replicas, planned.profile, planned.desired.plan
        auto = model.auto
        passive = m.other_slot(str(status["activeSlot"]))
        scale(p, children.deployments[passive], 0)
        ref = planned.reference
        if ref is not None and asc.mode(model) == "envelope":
            replicas = asc.tune(
                p,
                model,
                ref,
                arrivals=arrivals,
                tuners=self.tuners,
                current=replicas,
                capacity=plan_capacity(profile, plan) if auto else None,
            )
            scale(p, active_dep, replicas)
            if active_dep is not None:
                active_dep = {**active_dep, "spec": {**active_dep["spec"], "replicas": replicas}}
        steady(p, active_dep, replicas=replicas)
        self._canary(p, model)
        verified.publish(status, profile, refused=planned.slower)
        if model.autoscaling is not None:
            asc.publish_scale(p, replicas)
        if auto and status.phase == "Ready" and status.switch is None:
            if reading is None and self.estimates is not None:
                reading = ab.as_reading(self.estimates(p.namespace, p.name))
            observe_batch(
                p,
                model,
                reading=reading,
                optimizer=planned.optimizer,
                profile=profile,
                floor=planned.batch_floor,
                ceiling=planned.batch_top,
            )

    def _switching(
        self,
        p: Pass,
        children: Children,
        model: ModelSpec,
        *,
        desired: Rendering,
        replicas: int,
    ) -> bool:
        """Start or advance a switch; True when this pass is done (a switch is under way)."""
        status = p.status
        switch = status.switch
        stage = switch.stage if switch is not None else None
        deployments, service, timing = children.deployments, children.service, model.switch
        if stage is Stage.DRAINING:
            good = last_good(p, fallback=None)
            assert good is not None
            ended = advance_switch(
                p, deployments, service, target=good, replicas=replicas, timing=timing
            )
            return not ended
        if stage is Stage.ROLLOUT:
            assert switch is not None
            if switch.hash == desired.serving_hash:
                ended = advance_switch(
                    p, deployments, service, target=desired, replicas=replicas, timing=timing
                )
                return not ended
            if desired.serving_hash == status.get("servingHash"):
                abort(p, children.deployments, reason="spec changed back")
            else:  # superseded by a newer spec: render it into the passive slot instead
                start_switch(p, children.deployments, target=desired, replicas=replicas)
                return True
        if desired.serving_hash != status.get("servingHash"):
            switch = status.switch
            if switch is None or not switch.gave_up_on(desired.serving_hash):
                note = self._in_pod(p, children, model, desired=desired, replicas=replicas)
                if note is None:
                    return False  # switched in place: the pass goes on as at rest
                if isinstance(note, Pending):
                    return True  # the post to the pods is outstanding: a later pass ends it
                start_switch(p, children.deployments, target=desired, replicas=replicas, note=note)
                return True
        elif (switch := status.switch) is not None and switch.stage is Stage.ABORTED:
            status.set_switch(None)
        return False

    def _in_pod(
        self, p: Pass, children: Children, model: ModelSpec, *, desired: Rendering, replicas: int
    ) -> str | Pending | None:
        """Switch to ``desired`` inside the active slot's pods when that applies: None when it
        did, ``Pending`` while the post is outstanding, else why not ("" when it does not
        apply: no event)."""
        served = last_good(p, fallback=None)
        if self.pods is None or served is None:
            return ""
        if not switchable(served.spec, served.plan, desired.spec, desired.plan):
            return ""
        active = str(p.status["activeSlot"])
        why = switch_in_pod(
            p,
            active_dep=children.deployments[active],
            served=served,
            desired=desired,
            replicas=replicas,
            client=self.pods,
            timeout=model.switch.ready_timeout_seconds,
        )
        if isinstance(why, str):
            p.emit(
                "Warning", "InPodSwitchFailed", f"in-pod switch not done ({why}); switching slots"
            )
        return why

    def _canary(self, p: Pass, model: ModelSpec) -> None:
        """spec.canary at rest (:mod:`packrat.controller.switch.canary`), and a canary's
        leftovers once it is gone from the spec."""
        if self.canary is None or (model.canary is None and p.status.canary is None):
            return
        served = last_good(p, fallback=None)
        if served is not None:
            reconcile_canary(p, model=model, good=served, client=self.canary)

    def _first_deploy(
        self, p: Pass, children: Children, *, desired: Rendering, replicas: int
    ) -> None:
        status = p.status
        ensure_service(p, children.service, slot="a")
        dep = ensure_deployment(
            p, children.deployments["a"], slot="a", rendering=desired, replicas=replicas
        )
        status.set_serving(
            slot="a",
            serving_hash=desired.serving_hash,
            plan=desired.plan,
            serving_spec=desired.spec.stored_spec(),
        )
        status.set_endpoint(p.name, p.namespace, m.PORT)
        status.set_batch_current(desired.plan.batch)
        p.emit("Normal", "Deploying", f"slot a deploying plan {desired.plan.label}")
        steady(p, dep, replicas=replicas)

    def _refused(self, model: ModelSpec | None) -> list[str]:
        """Why the platform's allow-lists refuse ``model`` (empty: they do not)."""
        if model is None:
            return []
        return refused_by_policy(
            model.spec,
            self.config.policy,
            default_image=self.config.image,
            storage_hosts=self.config.storage.policy.hosts,
        )

    def _invalid(self, p: Pass, errors: list[str], *, reason: str = "InvalidSpec") -> None:
        p.status.failed(invalid=True)
        p.result.result = "invalid"
        message = "; ".join(errors)
        if p.status.get("message") != message:
            p.emit("Warning", reason, message)
        p.status.set_message(message)
        p.cond("Ready", False, reason, message)

    def _foreign(self, p: Pass, children: Children) -> bool:
        """Objects under our names that are not ours: nothing more is done until they go."""
        uid = p.obj["metadata"].get("uid")
        found = [("Service", p.name, children.service)] + [
            ("Deployment", m.deployment_name(p.name, slot), dep)
            for slot, dep in children.deployments.items()
        ]
        for kind, name, obj in found:
            if obj is not None and not owned_by(obj, name=p.name, uid=uid):
                p.conflict(kind, name)
        if not p.conflicts:
            return False
        message = conflict_message(p.conflicts)
        p.status.failed()
        p.result.result = "conflict"
        p.result.in_progress()  # a foreign object's removal sends us no event: look again
        p.status.set_message(message)
        p.cond("Ready", False, "OwnershipConflict", message)
        return True
