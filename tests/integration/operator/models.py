"""A served PackratModel as shared test state: measured once per cluster, brought back to a
known steady state before each test that needs it, whatever the tests before it did.

``ensure_served`` creates the model (profiling Job, plan, Deployment, Service) only when the
cluster has none under that name (first use, or a test deleted it) and records what a test
about that first pass wants to see (``Served``: the status, the model's own events and the
operator's metrics, at the moment it first became Ready). ``settle`` puts the spec back to a
base spec at the batch the model already serves (so no switch is needed) and waits until the
model is steady: Ready, no switch in progress, the spec's generation observed, the Service on
the active slot and no pod of the other slot left.

Every wait polls a condition, with deadlines sized for a loaded 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness import OperatorCluster, wait_for

# deadlines: profiling plus the first rollout, and anything that takes seconds when quiet
FIRST_READY_S = 720.0
STEADY_S = 240.0


def wait_ready(
    cluster: OperatorCluster,
    name: str,
    *,
    period: float = 0.25,
    detail: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """Waits (up to ``FIRST_READY_S``: profiling and the first rollout) for the model's phase
    Ready; gives its status. On a timeout: ``detail``, or the status and the operator's log."""
    wait_for(
        lambda: cluster.status(name).get("phase") == "Ready",
        timeout=FIRST_READY_S,
        what=f"{name} Ready",
        period=period,
        detail=detail or (lambda: f"status: {cluster.status(name)}\nlog:\n{cluster.log_tail(20)}"),
    )
    return cluster.status(name)


@dataclass(frozen=True)
class Served:
    """What the cluster looked like when the model first became Ready."""

    name: str
    uid: str
    status: dict[str, Any]
    events: list[dict[str, Any]]
    metrics_before: str
    metrics: str
    jobs: list[dict[str, Any]]


def tiny_spec(
    max_batch: int,
    *,
    cpus: int = 2,
    threads: tuple[int, ...] = (1, 2),
    precision: float | None = 0.2,
    budget_s: int | None = 40,
    ready_timeout_s: int = 300,
    drain_s: int = 2,
    zoo: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """The ``tiny`` model spec the operator tests share: 2 CPUs, a 2 ms batch delay, a
    profile over threads 1-2 and batches up to ``max_batch`` (no retry), a 2 s drain;
    ``ready_timeout_s`` defaults to the CRD's (a new slot's TorchServe took over 90 s to start
    on a loaded machine). ``precision`` and ``budget_s`` None: the CRD's defaults. Without
    ``zoo`` the spec names no model (the test adds its own source). ``extra``: more spec
    fields (batchSize, autoBatch, slo, ...)."""
    profiling: dict[str, Any] = {"maxBatch": max_batch, "threads": list(threads)}
    if precision is not None:
        profiling["precision"] = precision
    if budget_s is not None:
        profiling["timeBudgetSeconds"] = budget_s
    return {
        **({"model": {"zoo": "tiny"}} if zoo else {}),
        "cpus": cpus,
        "maxBatchDelayMs": 2,
        "profiling": {**profiling, "backoffLimit": 0},
        "switch": {"readyTimeoutSeconds": ready_timeout_s, "drainSeconds": drain_s},
        **extra,
    }


def body(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


def model_events(cluster: OperatorCluster, uid: str, reason: str | None = None) -> list[Any]:
    """Events about one incarnation of a model (by uid: a recreated model is another one)."""
    return [
        e
        for e in cluster.events(reason)
        if (e.get("involvedObject") or {}).get("uid") in (uid, None)
        and (e.get("involvedObject") or {}).get("kind", "PackratModel") == "PackratModel"
    ]


_SERVED: dict[tuple[int, str], Served] = {}


def ensure_served(
    cluster: OperatorCluster,
    name: str,
    spec: Mapping[str, Any],
    *,
    prepare: Callable[[OperatorCluster], None] | None = None,
) -> Served:
    """The model ``name`` exists and has been Ready at least once; created when missing."""
    current = cluster.api.get("packratmodels", name)
    key = (id(cluster), name)
    known = _SERVED.get(key)
    if current is not None and known is not None and current["metadata"]["uid"] == known.uid:
        return known
    if current is not None:  # not ours (or a leftover): start from a clean model
        cluster.api.delete("packratmodels", name)
        wait_for(
            lambda: cluster.api.get("packratmodels", name) is None,
            timeout=STEADY_S,
            what=f"{name} deleted before recreating it",
        )
    if prepare is not None:
        prepare(cluster)
    metrics_before = cluster.operator.metrics()
    created = cluster.api.create("packratmodels", body(name, spec))
    uid = created["metadata"]["uid"]
    wait_ready(cluster, name)
    served = Served(
        name=name,
        uid=uid,
        status=cluster.status(name),
        events=model_events(cluster, uid),
        metrics_before=metrics_before,
        metrics=cluster.operator.metrics(),
        jobs=cluster.api.list("jobs"),
    )
    _SERVED[key] = served
    return served


def steady(cluster: OperatorCluster, name: str) -> bool:
    """Ready, nothing in progress, the latest generation observed, the Service on the active
    slot, and only the active slot's pods running."""
    model = cluster.api.get("packratmodels", name)
    if model is None:
        return False
    status = model.get("status") or {}
    if status.get("phase") != "Ready" or "switch" in status:
        return False
    if status.get("observedGeneration") != model["metadata"].get("generation"):
        return False
    active = status.get("activeSlot")
    if not active or not status.get("readyReplicas"):
        return False
    svc = cluster.api.get("services", name) or {}
    if ((svc.get("spec") or {}).get("selector") or {}).get("packrat.dev/slot") != active:
        return False
    other = "b" if active == "a" else "a"
    return not cluster.agent.running(f"{name}-{other}")


def settle(
    cluster: OperatorCluster, name: str, base: Mapping[str, Any], *, batch: int | None = None
) -> dict[str, Any]:
    """Put the spec back to ``base`` (at ``batch``, or the batch the model serves now, so no
    switch is needed unless asked for) and wait until the model is steady; its status."""
    status = cluster.status(name)
    served_batch = int((status.get("plan") or {}).get("batch") or base.get("batchSize") or 1)
    spec: dict[str, Any] = {
        **{k: None for k in cluster.model(name)["spec"] if k not in base},
        **base,
        "batchSize": batch or served_batch,
    }
    if "autoBatch" not in base:
        spec["autoBatch"] = None
    cluster.api.patch("packratmodels", name, {"spec": spec})
    wait_for(
        lambda: steady(cluster, name),
        timeout=STEADY_S,
        what=f"{name} steady",
        period=0.25,
        detail=lambda: f"status: {cluster.status(name)}\nlog:\n{cluster.log_tail(10)}",
    )
    return cluster.status(name)
