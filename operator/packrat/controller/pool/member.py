"""A pooled PackratModel's pass (``spec.pool``): no Deployment of its own; its Service
selects the pool pod that hosts it once that pod answers for it.

It keeps its own profile and plan, on the pool's pod shape: the model's usual profiling Job
with the pool's ``cpus`` (:func:`pooled_spec`: a change of pool or of the pool's cores is a
new profile key, so a new profile, as a change of ``spec.cpus`` is), and the optimizer's plan
for its batch on those cores in ``status.poolPlan`` (with the profile's batch-1 latency on the
plan's threads: the pool's demand estimate). Measured while the pool serves it: serving
never waits on profiling. The pool's pass reads ``status.poolPlan`` (:mod:`.demand`).

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
from packrat.controller.api.frozen import thaw
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import InvalidSpec, ModelSpec
from packrat.controller.core.plans import to_status
from packrat.controller.core.status import get_condition
from packrat.controller.planning.autobatch import OptimizerCache
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.spec import parse_pool
from packrat.controller.profiling.profile import ensure_profile
from packrat.controller.serving import manifests as m
from packrat.controller.serving.protection import release
from packrat.plan.optimizer import PlanError

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
        if status.get("phase") == "Failed":  # its spec or name is invalid: it places nothing
            why = status.get("message") or "its spec is invalid"
            p.cond("Placed", False, "PoolInvalid", f"pool {pool} is invalid: {why}")
        else:
            p.cond("Placed", False, "Placing", f"pool {pool} has not placed the model yet")
        return None
    elif isinstance(over := record.get("overCapacity"), str):  # hosted, by memory only
        p.cond("Placed", False, "OverCapacity", f"pool {pool} pod {record['pod']}: {over}")
        return record
    else:
        p.cond("Placed", True, "Placed", f"on pool {pool} pod {record['pod']}")
        return record
    return None


def pooled_spec(model: ModelSpec, cpus: int) -> ModelSpec:
    """The model on its pool's pod shape: ``cpus`` cores, the thread counts it profiles
    limited to them (all of 1..cpus when none of its own ``profiling.threads`` is left),
    eager PyTorch only (what the pool pods run)."""
    threads = model.profiling.threads
    if not model.engines and (not threads or max(threads) <= cpus):
        return model.on_cpus(cpus)
    changes: dict[str, Any] = {"cpus": cpus}
    if model.engines:
        changes["engines"] = ["eager"]
    if threads and max(threads) > cpus:
        profiling = thaw(model.spec.get("profiling") or {})
        kept = [t for t in threads if t <= cpus]
        if kept:
            profiling["threads"] = kept
        else:
            profiling.pop("threads", None)
        changes["profiling"] = profiling
    return model.with_spec(**changes)


def plan_on_pool(
    p: Pass, model: ModelSpec, pool_obj: Mapping[str, Any], optimizers: OptimizerCache
) -> None:
    """The model's profile on the pool's cores (its profiling Job while there is none) and
    its plan for its batch on them, in ``status.poolPlan``; the phase is left to serving."""
    try:
        cpus = parse_pool(pool_obj).cpus
    except InvalidSpec:
        return  # the pool's own status says why; the last plan stays
    pooled = pooled_spec(model, cpus)
    key = pooled.profile_key
    configmap = p.kube.get("configmaps", p.namespace, m.profile_object_name(p.name, key))
    labels = {m.LABEL_MODEL: p.name, "app.kubernetes.io/name": m.PROFILING_APP}
    jobs = p.kube.list("jobs", p.namespace, labels=labels)
    status = p.status
    with status.facts_kept():
        profile = ensure_profile(p, pooled, configmap=configmap, jobs=jobs)
    if profile is None:
        return
    batch = model.fixed_batch
    try:
        optimizer = optimizers.optimizer(
            profile, digest=status.profile_digest, cpus=cpus, max_batch=batch
        )
        plan = optimizer.plan(batch)
    except PlanError as exc:
        status.set_pool_plan(None)
        p.cond("Planned", False, "PlanFailed", f"no plan on pool cpus={cpus} batch={batch}: {exc}")
        return
    threads = plan.instances[0].threads  # the widest: one request at a time per model
    batch1 = profile.latency(threads, 1)
    record = {
        "pool": model.pool,
        "cpus": cpus,
        "threads": threads,
        "batch": plan.batch,
        "plan": to_status(plan),
        **({"batch1LatencyMs": round(batch1, 4)} if batch1 is not None else {}),
    }
    status.set_pool_plan(record)
    p.result.plan = plan
    p.cond("Planned", True, "Planned", f"plan {plan.label} on pool {model.pool} ({cpus} cpus)")


def serve_in_pool(
    p: Pass,
    model: ModelSpec,
    service: Mapping[str, Any] | None,
    optimizers: OptimizerCache | None = None,
) -> bool:
    """The pass of a model with ``spec.pool``; False when its ordinary pass must run instead
    (it serves from its own pods until the pool answers for it). ``optimizers``: plan on
    the pool's cores too (None: serving only)."""
    pool = str(model.pool)
    pool_obj = p.kube.get("packratpools", p.namespace, pool)
    record = _placed(p, pool, pool_obj)
    status = p.status
    ready = record is not None and record.get("ready") is True
    if ready and record is not None and status.pool_pod != record.get("pod"):
        ready = record.get("current") is True  # moving here: the pod's config must be current
    if not ready and status.pool_pod is None and status.get("activeSlot") is not None:
        return False  # its own pods serve until the pool answers for it (and profile)
    if pool_obj is not None and optimizers is not None:
        plan_on_pool(p, model, pool_obj, optimizers)
    if not ready:
        p.result.in_progress()
        _waiting(p, pool, gone=pool_obj is None, record=record)
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


def _waiting(p: Pass, pool: str, *, gone: bool, record: Mapping[str, Any] | None) -> None:
    """Status while the pool does not serve the model where its Service points (or nowhere
    yet): the old pod while it moves between pods, else Ready False with why."""
    served, status = p.status.pool_pod, p.status
    if served is not None and record is not None and record.get("pod") != served:
        status.serving(ready_replicas=1, replicas=1)  # moving pods: the old one serves
    elif served is not None and record is not None:  # its pod stopped answering for it
        status.serving(ready_replicas=0, replicas=1)
        why = "is not ready, does not answer in time or does not list it"
        p.cond("Ready", False, "PoolPodNotReady", f"pool {pool} pod {served} {why}")
    elif served is not None and gone:
        p.cond("Ready", False, "NotPlaced", f"pool {pool} was deleted: {_GONE}")
    elif served is not None:  # the pool no longer hosts it (unplaced)
        p.cond("Ready", False, "NotPlaced", f"pool {pool} no longer hosts it")
    elif record is not None and record.get("ready") is True:  # listed, not current
        p.cond("Ready", False, "PoolConfigPending", _stale(pool, record))
    elif (placed := get_condition(status.get("conditions"), "Placed") or {}).get(
        "reason"
    ) in _NEVER:  # it will not be served until that changes: Ready says why
        p.cond("Ready", False, str(placed["reason"]), str(placed.get("message") or ""))
    else:
        p.cond("Ready", False, "PoolStarting", f"waiting for pool {pool} to serve it")


_NEVER = ("NotPlaced", "PoolNotFound", "PoolInvalid")  # Placed reasons no wait resolves


_GONE = "recreate it, or remove spec.pool to serve the model from its own pods"


def _stale(pool: str, record: Mapping[str, Any]) -> str:
    return (
        f"pool {pool} pod {record.get('pod')} lists it under another config than the one "
        "written last (its config_digest differs); its Service moves once the pod serves "
        "that one (a mounted ConfigMap is refreshed within about a minute)"
    )


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
