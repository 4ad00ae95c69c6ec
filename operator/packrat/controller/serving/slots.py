"""The serving slots: each slot's Deployment brought to what we set, and the steady state.

The active slot is always rendered from the last good configuration kept in status
(``servingSpec``, ``plan``, ``servingHash``), never from a spec that has not been served yet,
so a deleted or edited active Deployment comes back as it was, whatever the spec says now.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.children import keep
from packrat.controller.api.drift import covers
from packrat.controller.api.ownership import conflict_message, owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.plans import layout
from packrat.controller.serving import manifests as m
from packrat.controller.serving.admin_token import ensure_token
from packrat.controller.serving.pod_config import ensure_plan
from packrat.controller.serving.protection import protect_patch, release, terminating
from packrat.plan.optimizer import Plan

# fields of the pod spec we may have set before and must remove when the new one has none
_REMOVABLE = ("initContainers", "nodeSelector", "tolerations", "affinity")


@dataclass(frozen=True)
class Rendering:
    """What a slot's Deployment is built from."""

    spec: ModelSpec
    plan: Plan
    serving_hash: str  # of the spec and the whole plan (``status.servingHash``)


def last_good(p: Pass, *, fallback: ModelSpec | None) -> Rendering | None:
    """The configuration the active slot serves (None before the first deploy)."""
    status = p.status
    if not status.get("activeSlot") or not status.get("servingHash"):
        return None
    spec = status.served_spec(p.obj["metadata"], image=p.config.image) or fallback
    plan = status.served_plan
    if spec is None or plan is None:
        return None
    return Rendering(spec=spec, plan=plan, serving_hash=status["servingHash"])


def deployment_ready(dep: Mapping[str, Any] | None, replicas: int) -> bool:
    """All wanted pods of the current template are ready, and no pod of an older template is
    left (``kubectl rollout status``'s test: ``readyReplicas`` counts the old template's ready
    pods too, so a slot re-rendered while its old pod still runs is not ready yet)."""
    if dep is None:
        return False
    status = dep.get("status") or {}
    generation = dep.get("metadata", {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return False
    if int((dep.get("spec") or {}).get("replicas", 0)) != replicas:
        return False
    if replicas == 0:
        return True
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas", ready) or 0)
    total = int(status.get("replicas", updated) or 0)
    return ready >= replicas and updated >= replicas and total <= updated


def plan_hash(plan: Plan) -> str:
    """A short hash of what a plan makes the pods do (not its estimates)."""
    return hashlib.sha256(repr(layout(plan)).encode()).hexdigest()[:16]


def pod_template_hash(rendering: Rendering) -> str:
    """The hash of the slot's pod template (the plan's cores, not the plan): on the pods'
    ``packrat.dev/serving-hash`` label."""
    return rendering.spec.template_hash(rendering.plan.cpus)


def _ours_untouched(p: Pass, current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The existing Deployment, left as it is, while its pods' inputs are squatted."""
    return (
        dict(current) if owned_by(current, name=p.name, uid=p.obj["metadata"].get("uid")) else None
    )


def ensure_deployment(
    p: Pass,
    current: Mapping[str, Any] | None,
    *,
    slot: str,
    rendering: Rendering,
    replicas: int,
) -> dict[str, Any] | None:
    """Create the slot's Deployment or bring what we set (labels, template, replicas, our
    finalizer) back. One being deleted is left as it is: its pods serve until the pass lets it
    go (``failover``), and a new one is created once it is gone.

    The slot's plan ConfigMap (``rendering.plan``) and the model's admin token Secret come
    first: a pod the Deployment starts reads both. A slot that is not the active one (a
    switch's or a failover's target) also gets the plan's hash in its pod template, so pods
    it still runs on another plan with the same template (a slot still draining) are
    replaced; the active slot's template never has it changed: its plan changes in its pods.

    Returns the Deployment as it now is (None when it is not ours, or when the token Secret
    or the plan ConfigMap is someone else's: then nothing is created or changed, and the
    conflict is reported)."""
    ensure_token(p)
    squatted = ("Secret", m.admin_token_name(p.name)) in p.conflicts
    if not ensure_plan(p, slot=slot, plan=rendering.plan) or squatted:
        return None if current is None else _ours_untouched(p, current)
    pod_hash = pod_template_hash(rendering)
    want = m.serving_deployment(
        rendering.spec,
        slot=slot,
        serving_hash=pod_hash,
        replicas=replicas,
        limits=p.config.storage,
        plan_hash=None if slot == p.status.get("activeSlot") else plan_hash(rendering.plan),
    )
    dep_name = want["metadata"]["name"]

    def settle(current: Mapping[str, Any]) -> dict[str, Any] | None:
        if terminating(current):
            return dict(current)
        if not covers((current.get("spec") or {}).get("selector"), want["spec"]["selector"]):
            # the selector is immutable: replace the object (it is ours, and wrong)
            release(p.kube, p.namespace, current)
            p.kube.delete("deployments", p.namespace, dep_name)
            p.kube.create("deployments", p.namespace, want)
            p.emit("Warning", "DriftRepaired", f"deployment {dep_name}: selector replaced")
            return want
        return None

    def drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
        return _drift_patch(p, current, want, replicas=replicas, pod_hash=pod_hash)

    kept = keep(
        p.kube,
        "deployments",
        p.namespace,
        want,
        current=current,
        ours=p.owns,
        drift=drift,
        settle=settle,
    )
    if not kept.ours:
        p.conflict("Deployment", dep_name)
    return kept.obj


def _drift_patch(
    p: Pass,
    current: Mapping[str, Any],
    want: Mapping[str, Any],
    *,
    replicas: int,
    pod_hash: str,
) -> dict[str, Any]:
    """The merge patch that brings back what we set on our Deployment: its labels and pod
    template (a put-back template is a DriftRepaired event), else its replicas; and our
    finalizer. Empty when nothing differs."""
    spec = current.get("spec") or {}
    meta = current.get("metadata") or {}
    patch: dict[str, Any] = {}
    template = spec.get("template") or {}
    if not covers(template, want["spec"]["template"]) or not covers(
        meta.get("labels"), want["metadata"]["labels"]
    ):
        patch = _template_patch(template, want, replicas=replicas)
        if (meta.get("labels") or {}).get(m.LABEL_SERVING_HASH) == pod_hash:
            dep_name = want["metadata"]["name"]
            p.emit("Warning", "DriftRepaired", f"deployment {dep_name}: template put back")
    elif int(spec.get("replicas", 0)) != replicas:
        patch = {"spec": {"replicas": replicas}}
    if (protect := protect_patch(current)) is not None:
        patch["metadata"] = {**patch.get("metadata", {}), **protect["metadata"]}
    return patch


def _template_patch(
    template: Mapping[str, Any], want: Mapping[str, Any], *, replicas: int
) -> dict[str, Any]:
    """Our labels and pod template over what is there: pod fields we no longer set are
    nulled, and so is the plan annotation of operators before the plan ConfigMap."""
    new_template = want["spec"]["template"]
    pod_spec = dict(new_template["spec"])
    for key in _REMOVABLE:
        if key in (template.get("spec") or {}) and key not in pod_spec:
            pod_spec[key] = None
    # the plan label annotation of operators before the plan ConfigMap goes (null)
    stale = {m.ANNOTATION_PLAN: None}
    template_meta = dict(new_template["metadata"])
    template_meta["annotations"] = {**stale, **template_meta.get("annotations", {})}
    return {
        "metadata": {"labels": want["metadata"]["labels"], "annotations": stale},
        "spec": {
            "template": {"metadata": template_meta, "spec": pod_spec},
            "replicas": replicas,
        },
    }


def scale(p: Pass, current: Mapping[str, Any] | None, replicas: int) -> None:
    """Scale one of our Deployments (a missing, foreign or deleted one is left alone)."""
    if current is None or not owned_by(current, name=p.name, uid=p.obj["metadata"].get("uid")):
        return
    if terminating(current):
        return
    if int((current.get("spec") or {}).get("replicas", 0)) != replicas:
        p.kube.patch(
            "deployments",
            p.namespace,
            current["metadata"]["name"],
            {"spec": {"replicas": replicas}},
        )


def steady(p: Pass, dep: Mapping[str, Any] | None, *, replicas: int) -> None:
    """Phase, readiness and conditions of a model serving from its active slot."""
    status = p.status
    slot = str(status["activeSlot"])
    served = status.served_plan
    label = served.label if served is not None else None
    ready_replicas = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
    status.set_ready_replicas(ready_replicas)
    ready = deployment_ready(dep, replicas) and not p.conflicts
    was_ready = status.get("phase") == "Ready"
    phase = status.serving(
        ready_replicas=ready_replicas if ready else min(ready_replicas, replicas - 1),
        replicas=replicas,
    )
    if phase == "Ready":
        message = f"serving plan {label} on slot {slot}, {ready_replicas}/{replicas} ready"
        if not was_ready:
            p.emit("Normal", "Ready", message)
        p.cond("Ready", True, "Ready", message)
        p.cond("Degraded", False, "AllReplicasReady", "")
    else:
        p.result.in_progress()
        message = f"slot {slot}: {ready_replicas}/{replicas} replicas ready"
        reason = "ReplicasNotReady"
        if p.conflicts:
            reason = "OwnershipConflict"
            message = conflict_message(p.conflicts)
        p.cond("Ready", False, reason, message)
        if was_ready:
            p.cond("Degraded", True, reason, message)
    status.set_message(message)
    if status.switch is None and not any(
        c.get("type") == "Reconfiguring" for c in status.get("conditions") or []
    ):
        p.cond("Reconfiguring", False, "Stable", "")
