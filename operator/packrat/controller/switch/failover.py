"""A serving slot's Deployment deleted under the model: keep serving, replace, then let it go.

Each serving Deployment carries our finalizer (``protection``), so a background delete (the
default) only marks it: its ReplicaSet and pods stay and keep serving through the Service.

- The active slot's, protected, background delete: lost but serving. A switch under way ends
  (a rollout is aborted, its spec never served; a drain is complete). The last good
  configuration (``status.servingSpec``, ``plan``, ``servingHash``) is rendered into the
  other slot; once every pod there is ready the Service moves to it, and only then is the
  deleted Deployment let go (the garbage collector then removes its pods, which drain in their
  preStop delay). No request meets an empty slot.
- The active slot's, foreground delete (the garbage collector deletes the pods first) or
  without our finalizer: nothing to protect. It is let go at once and, as soon as it is gone,
  recreated in the same slot from the last good configuration by the pass's usual repair.
- A passive slot's (or one of a model not yet serving): let go at once.

No state of its own: the deleted Deployment, still listed until it is let go, is the record,
so a restarted operator continues where the last pass stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.status import get_condition
from packrat.controller.serving import manifests as m
from packrat.controller.serving.protection import pods_going, protected, release, terminating
from packrat.controller.serving.service import ensure_service
from packrat.controller.serving.slots import Rendering, deployment_ready, ensure_deployment, steady
from packrat.controller.switch.active_passive import end_switch

Deployments = Mapping[str, Mapping[str, Any] | None]
REASON = "ActiveDeploymentDeleted"


def _ours(p: Pass, dep: Mapping[str, Any] | None) -> bool:
    return dep is not None and owned_by(dep, name=p.name, uid=p.obj["metadata"].get("uid"))


def keeps_serving(dep: Mapping[str, Any] | None) -> bool:
    """A deleted Deployment whose pods stay until we let it go (protected, background)."""
    return terminating(dep) and protected(dep) and not pods_going(dep)


def release_unneeded(p: Pass, deployments: Deployments, *, active: str | None) -> None:
    """Let go every deleted Deployment of ours except an active one that keeps serving."""
    for slot, dep in deployments.items():
        if not terminating(dep) or not _ours(p, dep) or not protected(dep):
            continue
        if slot == active and keeps_serving(dep):
            continue
        assert dep is not None
        release(p.kube, p.namespace, dep)


def lost_active(
    p: Pass,
    deployments: Deployments,
    service: Mapping[str, Any] | None,
    *,
    good: Rendering,
    replicas: int,
) -> bool:
    """Handle a deleted active Deployment; True when it was (the pass is then done)."""
    status = p.status
    active = str(status["activeSlot"])
    dep = deployments.get(active)
    if not terminating(dep) or not _ours(p, dep):
        return False
    end_switch(p, reason=f"slot {active} Deployment deleted")
    p.result.in_progress()
    if not keeps_serving(dep):  # its pods are going: recreate it as soon as it is gone
        ensure_service(p, service, slot=active)
        message = f"slot {active} Deployment deleted with its pods; recreating it once it is gone"
        if (get_condition(status.get("conditions"), "Ready") or {}).get("reason") != REASON:
            p.emit("Warning", REASON, message)
        steady(p, None, replicas=replicas)
        p.cond("Ready", False, REASON, message)
        p.cond("Degraded", True, REASON, message)
        status.set_message(message)
        return True
    previous = get_condition(status.get("conditions"), "Reconfiguring") or {}
    target = m.other_slot(active)
    new = ensure_deployment(
        p, deployments.get(target), slot=target, rendering=good, replicas=replicas
    )
    served = status.served_plan
    label = served.label if served is not None else None
    if terminating(new) or not deployment_ready(new, replicas) or p.conflicts:
        ensure_service(p, service, slot=active)  # the deleted slot's pods serve meanwhile
        ready = int(((new or {}).get("status") or {}).get("readyReplicas") or 0)
        message = (
            f"slot {active} Deployment deleted; its pods keep serving until slot {target} "
            f"(last good plan {label}) is ready: {ready}/{replicas}"
        )
        if previous.get("reason") != REASON:
            p.emit("Warning", REASON, message)
        status.switching()
        p.cond("Reconfiguring", True, REASON, message)
        status.set_message(message)
        return True
    ensure_service(p, service, slot=target)
    status.set_active_slot(target)
    assert dep is not None
    release(p.kube, p.namespace, dep)
    message = f"service moved to slot {target} (last good plan {label}); slot {active} let go"
    p.emit("Normal", "FailedOver", message)
    steady(p, new, replicas=replicas)
    p.cond("Reconfiguring", False, "FailedOver", message)
    return True
