"""One reconcile pass for a PackratPool: its members placed on its pods, every child kept,
what the pods serve read back, then (only then) status written.

Placement is :func:`packrat.plan.pool.placement.place` by memory and demand: weight bytes
(the pods' measured layer-file sizes once known, the zoo's estimate before) and compute (each
model's request rate, from two readings of its pod's counter, times its service time on the
pool's cores, from its own plan: :mod:`packrat.plan.pool.demand`); the previous placement is
kept while it is feasible and close to the best (a move is a cold start). A model whose
weights fit but whose demand fits no pod is still hosted (by memory, on its previous pod
where there is one), its record saying why it is over capacity. A model moved to another
pod, or leaving the pool, is kept on the pod its Service selects until the model's pass
points the Service elsewhere
(its new pod, or its own pods once they answer): no request finds a pod without the model.
A pod that no longer exists in ``spec.replicas`` is kept while a model's Service selects it.
A model the pool cannot place gets a sentence why (``status.unplaced``; the model's pass
shows it in its ``Placed`` condition).

Level-triggered and idempotent; children never adopted (an object under one of our names
that this pool does not own is a conflict, left untouched).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api import crd
from packrat.controller.api.children import keep, labels_drift, service_drift
from packrat.controller.api.drift import covers, merge_patch
from packrat.controller.api.kube import KubeApi
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import Config, Pass, Result, run_pass
from packrat.controller.core.model import InvalidSpec
from packrat.controller.core.overrides import refused_by_policy
from packrat.controller.core.status import Status, get_condition, now_iso, parse_time
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.readings import Hosted, PoolReader
from packrat.controller.pool.spec import (
    MAX_REPLICAS,
    ZOO_WEIGHT_BYTES,
    Member,
    PoolPlan,
    PoolSpec,
    members,
    parse_pool,
)
from packrat.controller.serving.admin_token import Holder, ensure_token
from packrat.controller.serving.manifests import pool_token_name
from packrat.plan.pool.demand import RateReading, next_rate, service_seconds, sticky
from packrat.plan.pool.placement import ModelDemand, PodCapacity, place

PLURAL = crd.POOL_PLURAL
REFRESH_SECONDS = 15.0  # a serving pool reads its pods' /pool/status this often


class PoolStatus(Status):
    """A PackratPool's status; ``phase``: Failed (invalid spec), Serving (every model it
    hosts answers on its pod), else Pending."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        super().__init__(stored)
        self._phase = "Pending"

    @property
    def phase(self) -> str:
        return self._phase

    def report(self, phase: str) -> None:
        self._phase = phase

    def set(self, key: str, value: Any) -> None:
        self._set(key, value)


PoolPass = Pass[PoolStatus]


def pool_holder(pool: str) -> Holder:
    """The pool's admin token Secret, owned by the pool (its pods mount it)."""
    return Holder(crd.POOL_KIND, pool_token_name(pool), pm.pool_labels(pool))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each member goes (``assignment``), which pods host which models (``hosting``:
    the assignment plus the pods models are still served from) and why the rest do not."""

    assignment: dict[str, str]
    hosting: dict[str, dict[str, str]]  # pod -> {model: zoo name}
    unplaced: dict[str, str]
    demands: dict[str, ModelDemand]  # what placement used, per placeable model
    plans: dict[str, PoolPlan]  # the members' plans on the pool's cores
    over: dict[str, str]  # hosted although its demand fits no pod: why


def served_pods(models: list[dict[str, Any]], pool: str) -> dict[str, str]:
    """Model -> the pool pod its status says serves it (its Service selects that pod): one
    of the names the pool's pods can have (a status is writable by whoever may write status:
    ``p-evil`` would be a Deployment and ConfigMap of that name)."""
    pods = {pm.pod_name(pool, i) for i in range(MAX_REPLICAS)}
    out = {}
    for obj in models:
        record = (obj.get("status") or {}).get("pool")
        if isinstance(record, Mapping) and record.get("name") == pool:
            pod = record.get("pod")
            if isinstance(pod, str) and pod in pods:  # one of ours, not any name status holds
                out[str(obj["metadata"]["name"])] = pod
    return out


def baseline(record: Any) -> RateReading | None:
    """The rate baseline a pool's ``status.models[name].demand`` keeps (None: none, or not
    one this operator wrote)."""
    demand = record.get("demand") if isinstance(record, Mapping) else None
    if not isinstance(demand, Mapping):
        return None
    at = parse_time(demand.get("readAt")) if isinstance(demand.get("readAt"), str) else None
    pod, requests, rate = demand.get("pod"), demand.get("requests"), demand.get("rate")
    if at is None or not isinstance(pod, str) or not isinstance(requests, int):
        return None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 0:
        rate = 0.0
    return RateReading(pod, requests, at.timestamp(), float(rate))


def demand_of(m: Member, known: Mapping[str, Any]) -> ModelDemand:
    """What one member asks of a pod: its weight bytes, its rate (from the last baseline)
    and its service time (its plan's threads x its batch-1 latency on them)."""
    record = known.get(m.name)
    measured = record.get("fileBytes") if isinstance(record, Mapping) else None
    assert m.zoo is not None
    size = measured if isinstance(measured, int) and measured > 0 else ZOO_WEIGHT_BYTES[m.zoo]
    base = baseline(record)
    service = service_seconds(m.plan.threads, m.plan.batch1_ms) if m.plan else 0.0
    return ModelDemand(
        m.name, weight_bytes=size, rate=base.rate if base else 0.0, service_s=service
    )


def _over_capacity(
    unplaced: Mapping[str, str],
    demands: Mapping[str, ModelDemand],
    capacity: list[PodCapacity],
    assignment: dict[str, str],
    previous: Mapping[str, str],
) -> dict[str, str]:
    """Host the models left out for compute alone (their weights fit a pod's budget) by
    memory: their previous pod, else the pod with the fewest weight bytes; -> why each."""
    over: dict[str, str] = {}
    pods = {c.name: c for c in capacity}
    for name, why in sorted(unplaced.items()):
        d = demands[name]
        fits = [c.name for c in capacity if d.weight_bytes <= c.budget_bytes]
        if not fits:
            continue
        weights = {pod: 0 for pod in fits}
        for other, pod in assignment.items():
            if pod in weights:
                weights[pod] += demands[other].weight_bytes
        pod = previous.get(name) or ""
        if pod not in weights:
            pod = min(fits, key=lambda p: (weights[p] / pods[p].budget_bytes, p))
        assignment[name] = pod
        over[name] = f"over capacity: {why}"
    return over


def layout(
    spec: PoolSpec, found: list[Member], served: Mapping[str, str], known: Mapping[str, Any]
) -> Layout:
    """Place the members asking for the pool on its pods; keep every model where it is served."""
    pods = [pm.pod_name(spec.name, i) for i in range(spec.replicas)]
    zoo = {m.name: m.zoo for m in found if m.zoo is not None}
    demands = {m.name: demand_of(m, known) for m in found if m.placeable}
    previous = {n: str(r["pod"]) for n, r in known.items() if isinstance(r, Mapping) and "pod" in r}
    capacity = [PodCapacity(p, spec.budget_bytes, float(spec.cpus)) for p in pods]
    best = place(list(demands.values()), capacity, previous=previous)
    placement = sticky(best, previous, list(demands.values()), capacity)
    assignment = dict(placement.assignment)
    unplaced = dict(placement.unplaced)
    over = _over_capacity(unplaced, demands, capacity, assignment, previous)
    for name in over:
        unplaced.pop(name)
    for m in found:
        if m.problem is not None and not m.leaving:
            unplaced[m.name] = m.problem
    hosting: dict[str, dict[str, str]] = {p: {} for p in pods}
    for name, pod in assignment.items():
        hosting[pod][name] = zoo[name]
    for name, pod in served.items():  # until its Service leaves that pod
        if name in zoo:
            hosting.setdefault(pod, {})[name] = zoo[name]
    plans = {m.name: m.plan for m in found if m.plan is not None}
    return Layout(dict(sorted(assignment.items())), hosting, unplaced, demands, plans, over)


def demand_record(
    name: str, plan: Layout, hosted: Hosted | None, known: Mapping[str, Any], now: float
) -> dict[str, Any] | None:
    """``status.models[name].demand``: the rate baseline after this pass's reading, the
    rate and the cores it asks for (None: no reading yet)."""
    base = baseline(known.get(name))
    if hosted is not None:
        base = next_rate(base, pod=hosted.pod, requests=hosted.requests, at=now)
    if base is None:
        return None
    moment = datetime.datetime.fromtimestamp(base.at, datetime.UTC)
    service = plan.demands[name].service_s if name in plan.demands else 0.0
    return {
        "pod": base.pod,
        "requests": base.requests,
        "readAt": now_iso(moment),
        "rate": round(base.rate, 3),
        "cores": round(base.rate * service, 3),
        "serviceMs": round(service * 1000, 3),
    }


class PoolReconciler:
    """Runs passes for PackratPool objects (one at a time per object: the caller's job)."""

    def __init__(
        self, kube: KubeApi, *, config: Config | None = None, reader: PoolReader | None = None
    ) -> None:
        self.kube = kube
        self.config = config or Config()
        self.reader = reader

    def reconcile(
        self, namespace: str, name: str, *, now: datetime.datetime | None = None
    ) -> Result:
        return run_pass(
            self.kube,
            self.config,
            "packratpools",
            namespace,
            name,
            status=PoolStatus,
            step=self._pass,
            now=now,
        )

    def _pass(self, p: PoolPass) -> None:
        try:
            spec = parse_pool(p.obj)
        except InvalidSpec as exc:
            _invalid(p, exc.errors, "InvalidSpec")
            return
        # the platform's image allow-list (--allow-image) binds a pool's pods as a model's
        refused = refused_by_policy(
            {"image": spec.image} if spec.image else {},
            self.config.policy,
            default_image=self.config.image,
        )
        if refused:
            _invalid(p, refused, "PolicyRefused")
            return
        p.status.set_message(None)
        models = self.kube.list("packratmodels", p.namespace)
        found = members(spec.name, models, cpus=spec.cpus)
        known = p.status.get("models") or {}
        plan = layout(spec, found, served_pods(models, spec.name), known)
        # the pods' /pool/status needs the pool's token: no pod mounts a Secret not ours
        token = ensure_token(p, pool_holder(spec.name), ours=lambda obj: self._ours(p, obj))
        digests = self._keep_children(p, spec, plan) if token is not None else {}
        # only the pods this pool runs (its ConfigMap and Deployment): one under a name
        # that is not ours is a conflict, never read, and no model's Service moves to it
        expected = {pod: set(h) for pod, h in plan.hosting.items() if h and pod in digests}
        reader, ok = self.reader, token is not None
        readings = reader(p.namespace, spec.name, expected, token=token) if reader and ok else {}
        self._write_status(p, spec, plan, readings, digests)
        p.report_conflicts(crd.POOL_KIND)

    def _ours(self, p: PoolPass, obj: Mapping[str, Any]) -> bool:
        uid = p.obj["metadata"].get("uid")
        return owned_by(obj, name=p.name, uid=uid, kind=crd.POOL_KIND)

    def _keep_children(self, p: PoolPass, spec: PoolSpec, plan: Layout) -> dict[str, str]:
        """Keeps each pool pod's ConfigMap and Deployment and the Service; returns the digest
        of the config each pod should serve now, for the pods whose ConfigMap and Deployment
        are this pool's."""
        ours = lambda obj: self._ours(p, obj)  # noqa: E731
        digests: dict[str, str] = {}
        for pod, hosted in sorted(plan.hosting.items()):
            config = pm.pool_config(spec, list(hosted.items()), plan.plans)
            cm = pm.configmap(spec, pod, config)
            kept = keep(self.kube, "configmaps", p.namespace, cm, ours=ours, drift=_data_drift)
            if not kept.ours:
                p.conflict("ConfigMap", pod)
                continue
            want = pm.deployment(spec, pod, hosting=bool(hosted), image=self.config.image)
            if not keep(
                self.kube, "deployments", p.namespace, want, ours=ours, drift=_deployment_drift
            ).ours:
                p.conflict("Deployment", pod)
                continue  # its pods are not ours: not read, no Service moves to them
            digests[pod] = pm.config_digest(cm)
        if not keep(
            self.kube, "services", p.namespace, pm.service(spec), ours=ours, drift=service_drift
        ).ours:
            p.conflict("Service", spec.name)
        for resource in ("deployments", "configmaps"):  # pods gone from the spec, unused
            for obj in self.kube.list(resource, p.namespace, labels=pm.pool_labels(spec.name)):
                name = obj["metadata"]["name"]
                if name not in plan.hosting and self._ours(p, obj):
                    self.kube.delete(resource, p.namespace, name)
        return digests

    def _write_status(
        self,
        p: PoolPass,
        spec: PoolSpec,
        plan: Layout,
        readings: Mapping[str, Mapping[str, Hosted]],
        digests: Mapping[str, str],
    ) -> None:
        records: dict[str, Any] = {}
        known = p.status.get("models") or {}
        for name, pod in plan.assignment.items():
            hosted = readings.get(pod, {}).get(name)
            record = hosted.record() if hosted else {"pod": pod}
            records[name] = {**record, "pod": pod, "ready": hosted is not None}
            # the pod serves the config written last (not an older one that listed the model
            # too, before a move out and back): only then may a Service move to it
            records[name]["current"] = hosted is not None and hosted.config == digests.get(pod)
            demand = demand_record(name, plan, hosted, known, p.now.timestamp())
            if demand is not None:
                records[name]["demand"] = demand
            if name in plan.over:
                records[name]["overCapacity"] = plan.over[name]
        previous = {n: r.get("pod") for n, r in known.items()}
        for name, pod in plan.assignment.items():
            if previous.get(name) != pod:
                p.emit("Normal", "Placed", f"model {name} placed on pool pod {pod}")
        p.status.set("models", records or None)
        p.status.set("unplaced", plan.unplaced or None)
        hosting = sorted(pod for pod, hosted in plan.hosting.items() if hosted)
        p.status.set("replicas", len(hosting))
        p.status.set("readyReplicas", sum(1 for pod in hosting if pod in readings))
        p.status.set("placedModels", len(records))
        placed_ok = not plan.unplaced
        reason = "AllPlaced" if placed_ok else "NotPlaced"
        why = "; ".join(f"{n}: {r}" for n, r in sorted(plan.unplaced.items()))
        before = get_condition(p.status.get("conditions"), "Placed") or {}
        if why and before.get("message") != why:  # once per change, not every pass
            p.emit("Warning", "NotPlaced", why)
        p.cond("Placed", placed_ok, reason, why or f"{len(records)} models placed")
        serving = all(r["ready"] for r in records.values())
        if serving:
            p.status.report("Serving")
            p.cond("Ready", True, "Serving", f"{len(records)} models serving")
            p.result.again_within(REFRESH_SECONDS)
        else:
            waiting = sorted(n for n, r in records.items() if not r["ready"])
            p.cond("Ready", False, "PodsStarting", f"waiting for {', '.join(waiting)}")
            p.result.in_progress()


def _invalid(p: PoolPass, errors: list[str], reason: str) -> None:
    """Failed, with why (a Warning event when that changed); its children keep serving the
    last good configuration."""
    message = "; ".join(errors)
    if p.status.get("message") != message:
        p.emit("Warning", reason, message)
    p.status.report("Failed")
    p.status.set_message(message)
    p.cond("Ready", False, reason, message)


def _data_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    patch = labels_drift(current, want)
    if current.get("data") != want["data"]:
        patch["data"] = merge_patch(current.get("data") or {}, want["data"])
    return patch


def _deployment_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    if covers(current.get("spec"), want["spec"]):
        return labels_drift(current, want)
    return {"spec": want["spec"], **labels_drift(current, want)}
