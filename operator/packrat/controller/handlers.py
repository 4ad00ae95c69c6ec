"""kopf wiring: one daemon per PackratModel runs its passes; watches on the children wake it.
PackratPipelines get the same structure (:mod:`packrat.controller.pipeline_handlers`).

Event-driven: a change to a model or to any object it owns (Deployments, the Service,
profiling Jobs and their pods, profile ConfigMaps, found by their labels) wakes that
model's daemon at once. While something is in progress (profiling, a switch, pods
starting) the daemon looks again every ``poll_seconds``; a model at rest is only re-read
every ``resync_seconds`` (a safety net), so idle cost does not grow with events elsewhere.
Passes of one model are sequential by construction (one daemon); they run in a bounded
thread pool. An API error leaves status as it was and is retried with exponential backoff
(with jitter). When the next pass runs is decided by :mod:`packrat.controller.planning.schedule`.

Our finalizer on serving Deployments (``protection``) never outlives its model: a model's
delete lets every one go, and so does the event of a held Deployment whose model has no daemon.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from packrat.controller.api.kube import Kube, KubeApi
from packrat.controller.core import metrics
from packrat.controller.core.fanout import shared_fanout
from packrat.controller.core.model import InvalidSpec, ModelSpec, Parsed
from packrat.controller.core.spec import GROUP, PLURAL, VERSION
from packrat.controller.core.wakeups import Wakeups, register_daemon
from packrat.controller.model.reconcile import Config, Reconciler, Result
from packrat.controller.pipeline.latency import RouterLatency
from packrat.controller.pipeline.reconcile import PipelineReconciler
from packrat.controller.pipeline_handlers import post_events, register_pipelines
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning import autoscale_metrics, schedule
from packrat.controller.planning.arrivals import ArrivalReader
from packrat.controller.planning.estimates import EstimateReader
from packrat.controller.pool.readings import PoolReader
from packrat.controller.pool.reconcile import PoolReconciler
from packrat.controller.pool.wiring import register_pools
from packrat.controller.serving import manifests as m
from packrat.controller.serving.protection import held
from packrat.controller.switch.canary import CanaryClient
from packrat.controller.switch.inpod import PodClient
from packrat.controller.switch.plan_poster import PlanPoster

logger = logging.getLogger(__name__)

# (group, version, plural, labels) of the children whose events wake their model's daemon
CHILD_WATCHES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("apps/v1", "deployments", {"app.kubernetes.io/managed-by": m.MANAGER}),
    ("v1", "services", {"app.kubernetes.io/managed-by": m.MANAGER}),
    ("batch/v1", "jobs", {"app.kubernetes.io/managed-by": m.MANAGER}),
    ("v1", "configmaps", {"app.kubernetes.io/managed-by": m.MANAGER}),
    ("v1", "pods", {"app.kubernetes.io/name": m.PROFILING_APP}),
)


def label_selector(labels: Mapping[str, str]) -> str:
    """``labels`` as a Kubernetes equality-based label selector (``k=v,k2=v2``)."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


@dataclass(frozen=True)
class OperatorOptions:
    """Settings of one operator process."""

    config: Config = field(default_factory=Config)
    # a model at rest is re-read this often (safety net; changes arrive as watch events)
    resync_seconds: float = 300.0
    # while something is in progress (profiling, a switch, pods starting)
    poll_seconds: float = 2.0
    # an autoBatch model at rest reads its pods' batch-size estimates this often: each pass
    # is one observation of autoBatch.sustainObservations (nothing else would wake it)
    estimate_seconds: float = 5.0
    max_workers: int = 8
    # With an exact list of namespaces the operator needs no cluster-wide list/watch of
    # namespaces and CRDs (least privilege); the CRD must then exist before it starts.
    scanning: bool = True
    # Where the operator reads a model's /status (batch-size estimate, for autoBatch).
    serving_url: str = "http://{service}.{namespace}.svc:8080"
    # Where the operator reads each ready serving pod's /status and posts a new plan to it
    # ({ip}, {pod}, {namespace}).
    pod_url: str = "http://{ip}:8080"
    # a plan change that keeps the cores is switched inside the running pods
    inpod_switch: bool = True

    @property
    def cadence(self) -> schedule.Cadence:
        """The intervals the schedule of passes follows."""
        return schedule.Cadence(
            resync_seconds=self.resync_seconds,
            poll_seconds=self.poll_seconds,
            estimate_seconds=self.estimate_seconds,
            storage_check_seconds=self.config.storage_check_seconds,
        )


def _publish(body: kopf.Body, result: Result) -> None:
    namespace = body.get("metadata", {}).get("namespace", "")
    name = body.get("metadata", {}).get("name", "")
    metrics.record_reconcile(namespace, name, result.result)
    metrics.record_phase(namespace, name, result.phase)
    if result.profiling_seconds is not None:
        metrics.record_profiling(namespace, name, result.profiling_seconds)
    if result.switch_result is not None:
        metrics.record_switch(namespace, name, result.switch_result)
    if (progress := result.profiling_progress) is not None:
        metrics.record_profiling_progress(
            namespace,
            name,
            done=progress["done"],
            total=progress["total"],
            eta_seconds=progress.get("etaSeconds"),
        )
    metrics.publish_autobatch(
        namespace=namespace,
        model=name,
        observed_batch=result.observed_batch,
        decision=result.decision,
        switch_seconds=result.switch_seconds,
    )
    if result.cores_exclusive is not None:
        metrics.record_cores_exclusive(namespace, name, result.cores_exclusive)
    if result.autoscale is not None:
        autoscale_metrics.publish(namespace, name, result.autoscale)
    if result.plan is not None:
        plan = result.plan
        metrics.record_plan(
            namespace,
            name,
            expected_speedup=plan.expected_speedup,
            expected_latency_ms=plan.expected_latency_ms,
        )
    for kind, reason, message in result.events:
        logger.info("%s/%s %s %s: %s", namespace, name, kind, reason, message)
        metrics.record_event(namespace, name, kind, reason)
        try:
            kopf.event(body, type=kind, reason=reason, message=message)
        except Exception:  # events are best effort
            logger.exception("could not post event %s", reason)


def typed(body: Mapping[str, Any], options: OperatorOptions) -> ModelSpec | None:
    """The model's typed spec (None when invalid: its pass says why)."""
    parsed = _parsed(body, options)
    return parsed.model if parsed is not None else None


def _parsed(body: Mapping[str, Any], options: OperatorOptions) -> Parsed | None:
    try:
        return Parsed.of(body, default_image=options.config.image)
    except InvalidSpec:
        return None


def _owner_key(meta: Mapping[str, Any]) -> str | None:
    labels = meta.get("labels") or {}
    name = labels.get(m.LABEL_MODEL) or labels.get("app.kubernetes.io/instance")
    if not name:
        return None
    return f"{meta.get('namespace', 'default')}/{name}"


@dataclass(frozen=True)
class _Parts:
    """The operator's clients of the cluster and of the pods (one shared fan-out pool)."""

    reconciler: Reconciler
    estimates: EstimateReader
    arrivals: ArrivalReader
    pipelines: PipelineReconciler
    latency: RouterLatency
    pools: PoolReconciler


def _build_parts(options: OperatorOptions, kube: KubeApi | None) -> _Parts:
    api = kube or Kube()
    fanout = shared_fanout()  # every read from and post to a pod, one pool
    poster = PlanPoster(fanout)
    pods = PodClient(options.pod_url, poster) if options.inpod_switch else None
    canary = CanaryClient(options.pod_url, options.serving_url, fanout=fanout)
    return _Parts(
        reconciler=Reconciler(api, config=options.config, pods=pods, canary=canary),
        estimates=EstimateReader(
            api, pod_url=options.pod_url, service_url=options.serving_url, fanout=fanout
        ),
        arrivals=ArrivalReader(api, pod_url=options.pod_url, fanout=fanout),
        pipelines=PipelineReconciler(api, config=options.config),
        latency=RouterLatency(api, pod_url=options.pod_url, fanout=fanout),
        pools=PoolReconciler(
            api,
            config=options.config,
            reader=PoolReader(api, pod_url=options.pod_url, fanout=fanout),
        ),
    )


class _LazyParts:
    """The parts, built on first use (in a reconcile thread: the first pass, not
    build_registry, reads the kubeconfig)."""

    def __init__(self, options: OperatorOptions, kube: KubeApi | None) -> None:
        self._options = options
        self._kube = kube
        self._parts: _Parts | None = None

    def __call__(self) -> _Parts:
        if self._parts is None:
            self._parts = _build_parts(self._options, self._kube)
        return self._parts


def _run_pass(
    parts: _LazyParts,
    namespace: str,
    name: str,
    before: schedule.Before,
    known: Parsed | None,
) -> tuple[Result, ab.Reading | None]:
    """One reconcile pass of a model, its pods' readings taken first as ``before`` says (a
    reconcile thread), and the estimates it read; ``known``: its spec as the daemon parsed
    it (not parsed again when the pass reads the same)."""
    built = parts()
    reading, seen = schedule.read_before_pass(
        built.estimates,
        built.arrivals,
        namespace,
        name,
        want_estimates=before.estimates,
        want_arrivals=before.arrivals,
        ingress=before.ingress,
    )
    result = built.reconciler.reconcile(
        namespace, name, reading=reading, arrivals=seen, known=known
    )
    return result, reading


def _configure(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """kopf's settings at startup: persistence under our group, quiet events, watches
    filtered by label on the server."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.execution.max_workers = options.max_workers
    # kopf's own per-handler messages stay out of the cluster's Events and the log; the
    # reconcile pass posts its own Events for transitions.
    settings.posting.level = logging.WARNING
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = 300
    # watch only what is ours: the API server filters the children's watch streams by
    # label (kopf's ``labels=`` on a handler filters in the operator, after every object
    # of the kind in the cluster has been sent and parsed), so the operator's memory and
    # watch traffic grow with Packrat's objects, not with the cluster's
    for api_version, plural, labels in CHILD_WATCHES:
        settings.watching.label_selectors[api_version, plural] = label_selector(labels)
    settings.scanning.disabled = not options.scanning
    # a deleted model's daemon is cancelled at once, so the finalizer goes promptly
    settings.background.cancellation_polling = 1.0


def _register_model_daemon(
    registry: kopf.OperatorRegistry,
    options: OperatorOptions,
    *,
    pool: ThreadPoolExecutor,
    parts: _LazyParts,
    wakeups: Wakeups,
) -> None:
    """The PackratModel daemon: each pass runs in ``pool``; its result sets the next delay."""

    async def one_pass(body: kopf.Body, namespace: str, name: str) -> float | None:
        known = _parsed(body, options)
        model = known.model if known is not None else None
        # keyed on the spec and the status stored before this pass (its own write arrives
        # later as a watch event)
        before = schedule.before_pass(model, body.get("status") or {})
        loop = asyncio.get_running_loop()
        result, reading = await loop.run_in_executor(
            pool, _run_pass, parts, namespace, name, before, known
        )
        if result.result == "gone":
            metrics.forget_model(namespace, name)
            parts().reconciler.tuners.forget(namespace, name)
            parts().arrivals.forget(namespace, name)
            parts().estimates.forget(namespace, name)
            return None
        _publish(body, result)
        wait = schedule.next_pass(options.cadence, before, result.again, reading)
        if wait.peek_every is None:
            return wait.delay
        assert reading is not None and before.fast is not None
        peeks = functools.partial(parts().estimates.peek, namespace, name)
        return await schedule.peek_until(
            wait.delay,
            every=wait.peek_every,
            basis=reading,
            fast=before.fast,
            wakeup=wakeups.get(f"{namespace}/{name}"),
            peek=lambda: loop.run_in_executor(pool, peeks),
        )

    def on_error(namespace: str, name: str, exc: Exception, failures: int) -> None:
        metrics.record_error(namespace, name, type(exc).__name__)
        logger.warning(
            "reconcile of %s/%s failed (%s), retrying: %s", namespace, name, failures, exc
        )

    register_daemon(
        registry,
        PLURAL,
        wakeups=wakeups,
        one_pass=one_pass,
        on_error=on_error,
        backoff_s=options.poll_seconds,
        ids=("model_daemon", "updated", "wake-on-generation"),
    )


LetGo = Callable[[str, Mapping[str, Any] | None], Awaitable[None]]


def _orphan_release(pool: ThreadPoolExecutor, parts: _LazyParts, wakeups: Wakeups) -> LetGo:
    """``let_go(key, meta)``: let the model's serving Deployments go, but those a live
    model owns; ``meta`` None (a model's delete) raises for kopf to retry, a child's
    event (its ``meta``) logs and tries again at the next listing."""

    async def let_go(key: str, meta: Mapping[str, Any] | None) -> None:
        namespace, _, name = key.partition("/")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(pool, parts().reconciler.release_orphans, namespace, name)
        except Exception as exc:
            if meta is None:
                raise  # kopf retries the delete handler
            wakeups.forget(meta)  # the next listing of the Deployment tries again
            logger.warning("could not let %s go: %s", meta.get("name"), exc)

    return let_go


def _register_child_watches(
    registry: kopf.OperatorRegistry,
    wakeups: Wakeups,
    *,
    let_go: LetGo,
    wake_pipeline: Callable[[Mapping[str, Any]], None],
) -> None:
    """A change to a child (found by its labels) wakes its model's daemon; a held
    Deployment whose model has no daemon is let go."""
    for api_version, plural, labels in CHILD_WATCHES:

        @kopf.on.event(
            api_version,
            plural,
            id=f"wake-on-{plural}",
            labels=labels,  # type: ignore[arg-type]
            registry=registry,
        )
        async def child_changed(meta: kopf.Meta, **kwargs: Any) -> None:
            key = _owner_key(meta)
            if key is not None and wakeups.changed(meta, kwargs.get("type")):
                if not wakeups.wake(key) and held(meta, kwargs.get("type")):
                    await let_go(key, meta)  # no pass of its model runs
                wake_pipeline(meta)  # a pipeline's router objects carry its label


def build_registry(
    options: OperatorOptions, *, kube: KubeApi | None = None
) -> kopf.OperatorRegistry:
    """A kopf registry with the PackratModel and PackratPipeline handlers (no global state:
    one per operator). kopf names a handler without an ``id`` by its qualified name, kept
    in annotations: ``configure``, ``login`` and ``deleted`` stay defined here."""
    registry = kopf.OperatorRegistry()
    wakeups = Wakeups()
    pool = ThreadPoolExecutor(max_workers=options.max_workers, thread_name_prefix="reconcile")
    parts = _LazyParts(options, kube)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings, options)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    _register_model_daemon(registry, options, pool=pool, parts=parts, wakeups=wakeups)
    wake_pipeline = register_pipelines(
        registry,
        options,
        pool=pool,
        reconciler=lambda: parts().pipelines,
        latency=lambda: parts().latency,
        wakeups=Wakeups(),
    )
    wake_pool = register_pools(
        registry,
        poll_seconds=options.poll_seconds,
        resync_seconds=options.resync_seconds,
        pool=pool,
        reconciler=lambda: parts().pools,
        wakeups=Wakeups(),
        wake_model=wakeups.wake,
        post_events=post_events,
    )
    let_go = _orphan_release(pool, parts, wakeups)

    def wake_owners(meta: Mapping[str, Any]) -> None:  # a pipeline's or a pool's child
        wake_pipeline(meta)
        wake_pool(meta)

    _register_child_watches(registry, wakeups, let_go=let_go, wake_pipeline=wake_owners)

    @kopf.on.delete(GROUP, VERSION, PLURAL, backoff=2.0, registry=registry)
    async def deleted(meta: kopf.Meta, **_: Any) -> None:
        """Let the model's Deployments go: the garbage collector deletes them after it."""
        await let_go(f"{meta.get('namespace', 'default')}/{meta['name']}", None)

    return registry
