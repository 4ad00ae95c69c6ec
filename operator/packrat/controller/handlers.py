"""Thin kopf handlers: every trigger runs one reconcile pass (``reconcile.Reconciler``).

Create and update events give a prompt first pass; a per-object timer repeats the pass, which
is how waiting (for a Job, for ready pods, for a drain period) is expressed. Passes for one
object are serialised by a lock, and each pass re-reads the object, so overlapping triggers
cannot act on stale state. Events and metrics are emitted from the pass's result.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf

from packrat.controller import metrics
from packrat.controller.autobatch import EstimateReader
from packrat.controller.kube import Kube, KubeApi
from packrat.controller.reconcile import Config, Reconciler, Result
from packrat.controller.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorOptions:
    """Settings of one operator process."""

    config: Config = field(default_factory=Config)
    resync_seconds: float = 5.0
    max_workers: int = 8
    # With an exact list of namespaces the operator needs no cluster-wide list/watch of
    # namespaces and CRDs (least privilege); the CRD must then exist before it starts.
    scanning: bool = True
    # Where the operator reads a model's /status (batch-size estimate, for autoBatch).
    serving_url: str = "http://{service}.{namespace}.svc:8080"
    # Where the operator reads each ready serving pod's /status ({ip}, {pod}, {namespace}).
    pod_url: str = "http://{ip}:8080"


class _Locks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def get(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def drop(self, key: str) -> None:
        with self._guard:
            self._locks.pop(key, None)


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
    if result.plan is not None:
        plan = result.plan
        metrics.record_plan(
            namespace,
            name,
            expected_speedup=plan.get("expected_speedup"),
            expected_latency_ms=plan.get("expected_latency_ms"),
        )
    for kind, reason, message in result.events:
        logger.info("%s/%s %s %s: %s", namespace, name, kind, reason, message)
        metrics.record_event(namespace, name, kind, reason)
        try:
            kopf.event(body, type=kind, reason=reason, message=message)
        except Exception:  # events are best effort
            logger.exception("could not post event %s", reason)


def build_registry(
    options: OperatorOptions, *, kube: KubeApi | None = None
) -> kopf.OperatorRegistry:
    """A kopf registry with the PackratModel handlers (no global state: one per operator)."""
    registry = kopf.OperatorRegistry()
    locks = _Locks()
    state: dict[str, Reconciler] = {}

    def reconciler() -> Reconciler:
        if "r" not in state:
            api = kube or Kube()
            state["r"] = Reconciler(
                api,
                config=options.config,
                estimates=EstimateReader(
                    api, pod_url=options.pod_url, service_url=options.serving_url
                ),
            )
        return state["r"]

    def run_pass(body: kopf.Body, trigger: str) -> None:
        meta = body.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta["name"]
        key = f"{namespace}/{name}"
        with locks.get(key):
            try:
                result = reconciler().reconcile(namespace, name)
            except Exception as exc:
                metrics.record_error(namespace, name, type(exc).__name__)
                logger.exception("reconcile of %s (%s) failed", key, trigger)
                return
        if result.result == "gone":
            metrics.forget_model(namespace, name)
            locks.drop(key)
            return
        _publish(body, result)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.execution.max_workers = options.max_workers
        # kopf's own per-handler messages ("Timer succeeded") stay out of the cluster's
        # Events and the log; the reconcile pass posts its own Events for transitions.
        settings.posting.level = logging.WARNING
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        settings.watching.server_timeout = 300
        settings.scanning.disabled = not options.scanning
        # A deleted model's timer may be mid-pass; check again soon instead of kopf's 60 s,
        # so the finalizer goes (and the garbage collector starts) promptly.
        settings.background.cancellation_polling = 1.0

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def created(body: kopf.Body, **_: Any) -> None:
        run_pass(body, "create")

    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    def updated(body: kopf.Body, **_: Any) -> None:
        run_pass(body, "update")

    @kopf.timer(GROUP, VERSION, PLURAL, interval=options.resync_seconds, registry=registry)
    def resync(body: kopf.Body, **_: Any) -> None:
        run_pass(body, "timer")

    return registry
