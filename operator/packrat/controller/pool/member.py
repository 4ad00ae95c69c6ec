"""A pooled PackratModel's pass (``spec.pool``): no profile, no Deployment of its own; its
Service selects the pool pod that hosts it once that pod answers for it.

Moving in keeps serving: while the pool does not yet answer for the model, a model that was
serving from its own pods goes on doing so (its ordinary pass runs); once the pool pod
serves it, the Service is pointed at that pod and only then are the model's own Deployments
deleted (their last good configuration stays in status, for a move out). Moving to another
pool pod works the same way: the Service stays on the old pod until the new one answers.
Moving out is the ordinary pass with one rule
(:func:`packrat.controller.serving.service.hold_service`): the Service stays on the pool pod
until the model's own active slot is ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.children import keep, service_drift
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.pool import manifests as pm
from packrat.controller.serving import manifests as m
from packrat.controller.serving.protection import release

_STATS = ("residentBytes", "fileBytes", "requests", "coldStarts", "lastUse")


def _placed(p: Pass, pool: str, obj: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The pool's record of this model (None: not placed), the ``Placed`` condition set."""
    status = (obj or {}).get("status") or {}
    record = (status.get("models") or {}).get(p.name)
    why = (status.get("unplaced") or {}).get(p.name)
    if obj is None:
        p.cond("Placed", False, "PoolNotFound", f"no PackratPool {pool} in {p.namespace}")
    elif isinstance(why, str):
        p.cond("Placed", False, "NotPlaced", f"pool {pool}: {why}")
    elif not isinstance(record, Mapping) or not isinstance(record.get("pod"), str):
        p.cond("Placed", False, "Placing", f"pool {pool} has not placed the model yet")
        return None
    else:
        p.cond("Placed", True, "Placed", f"on pool {pool} pod {record['pod']}")
        return record
    return None


def serve_in_pool(p: Pass, model: ModelSpec, service: Mapping[str, Any] | None) -> bool:
    """The pass of a model with ``spec.pool``; False when its ordinary pass must run instead
    (it serves from its own pods until the pool answers for it)."""
    pool = str(model.pool)
    record = _placed(p, pool, p.kube.get("packratpools", p.namespace, pool))
    status = p.status
    ready = record is not None and record.get("ready") is True
    if not ready:
        if status.pool_pod is None and status.get("activeSlot") is not None:
            return False  # its own pods serve until the pool answers for it
        p.result.in_progress()
        if status.pool_pod is not None and record is not None:
            status.serving(ready_replicas=1, replicas=1)  # moving pods: the old one serves
        elif status.pool_pod is not None:  # the pool no longer hosts it (gone, unplaced)
            p.cond("Ready", False, "NotPlaced", f"pool {pool} no longer hosts it")
        else:
            p.cond("Ready", False, "PoolStarting", f"waiting for pool {pool} to serve it")
        return True
    assert record is not None
    pod = str(record["pod"])
    want = pm.member_service(model.owner(), pool=pool, pod=pod)
    if not keep(
        p.kube, "services", p.namespace, want, current=service, ours=p.owns, drift=service_drift
    ).ours:
        p.conflict("Service", p.name)
        return True
    switched = status.pool_pod == pod  # the Service selected the pod before this pass
    if not switched:
        p.emit("Normal", "Pooled", f"served by pool {pool} pod {pod}")
        p.result.in_progress()  # its own pods go on the next pass, once endpoints follow
    status.set_pool({"name": pool, **{k: record[k] for k in _STATS if k in record}, "pod": pod})
    status.set_endpoint(p.name, p.namespace, m.PORT)
    if switched:
        _drop_own_pods(p)
    status.serving(ready_replicas=1, replicas=1)
    p.cond("Ready", True, "Pooled", f"served by pool {pool} pod {pod}")
    p.result.again_within(30.0)  # its figures (resident bytes, cold starts) from the pool
    return True


def _drop_own_pods(p: Pass) -> None:
    """Delete the model's own slot Deployments (the Service no longer selects them)."""
    for slot in m.SLOTS:
        name = m.deployment_name(p.name, slot)
        dep = p.kube.get("deployments", p.namespace, name)
        if dep is None or not p.owns(dep):
            continue
        release(p.kube, p.namespace, dep)
        if not (dep.get("metadata") or {}).get("deletionTimestamp"):
            p.kube.delete("deployments", p.namespace, name)
