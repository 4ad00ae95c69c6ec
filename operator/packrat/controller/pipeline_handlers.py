"""kopf wiring for PackratPipelines: one daemon per pipeline runs its passes; watches on its
children wake it.

The same structure as the PackratModel daemon (:mod:`packrat.controller.handlers`): a change
to the pipeline, to one of its stage models (their status moves as they profile, switch and
become ready) or to its router's Deployment, ConfigMap or Service wakes that pipeline's
daemon at once; while it is not serving, it also looks again every ``poll_seconds``. Once it
serves, a pass every ``MEASURE_SECONDS`` first reads its router pods' latency histograms
(``status.measuredP99Ms``, over the trailing ``WINDOW_SECONDS``); the ``resync_seconds``
safety net covers the rest. Passes of one pipeline are sequential (one daemon) and run in
the operator's thread pool; an API error leaves status as it was and is retried with
exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import kopf

from packrat.controller.core.context import Result
from packrat.controller.core.spec import GROUP, VERSION
from packrat.controller.core.spec import PLURAL as MODELS
from packrat.controller.core.wakeups import Wakeups, logged_errors, register_daemon
from packrat.controller.pipeline.latency import RouterLatency
from packrat.controller.pipeline.manifests import LABEL_PIPELINE
from packrat.controller.pipeline.reconcile import PLURAL, PipelineReconciler
from packrat.controller.planning.schedule import pipeline_delay

if TYPE_CHECKING:
    from packrat.controller.handlers import OperatorOptions

logger = logging.getLogger(__name__)

# a serving pipeline reads its router pods' latency histograms this often (measuredP99Ms)
MEASURE_SECONDS = 30.0


def pipeline_key(meta: Mapping[str, Any]) -> str | None:
    """The pipeline a child belongs to (by its ``packrat.dev/pipeline`` label)."""
    name = (meta.get("labels") or {}).get(LABEL_PIPELINE)
    return f"{meta.get('namespace', 'default')}/{name}" if name else None


def post_events(body: kopf.Body, result: Result) -> None:
    meta = body.get("metadata", {})
    for kind, reason, message in result.events:
        logger.info(
            "%s/%s %s %s: %s", meta.get("namespace"), meta.get("name"), kind, reason, message
        )
        try:
            kopf.event(body, type=kind, reason=reason, message=message)
        except Exception:  # events are best effort
            logger.exception("could not post event %s", reason)


def register_pipelines(
    registry: kopf.OperatorRegistry,
    options: OperatorOptions,
    *,
    pool: Executor,
    reconciler: Callable[[], PipelineReconciler],
    latency: Callable[[], RouterLatency],
    wakeups: Wakeups,
) -> Callable[[Mapping[str, Any]], None]:
    """Add the PackratPipeline handlers to ``registry``; returns the function the model
    handlers' child watches call with a changed child's metadata (router objects)."""

    def wake_owner(meta: Mapping[str, Any]) -> None:
        key = pipeline_key(meta)
        if key is not None:
            wakeups.wake(key)

    async def one_pass(body: kopf.Body, namespace: str, name: str) -> float | None:
        serving = (body.get("status") or {}).get("phase") == "Serving"

        def run_pass() -> Result:
            # the routers' histograms are read before the pass, never during it
            measured = latency()(namespace, name) if serving else None
            return reconciler().reconcile(namespace, name, measured=measured)

        result = await asyncio.get_running_loop().run_in_executor(pool, run_pass)
        if result.result == "gone":
            latency().forget(namespace, name)
            return None
        post_events(body, result)
        serving_now = result.phase == "Serving"
        return pipeline_delay(
            options.cadence, result.again, serving=serving_now, measure=MEASURE_SECONDS
        )

    register_daemon(
        registry,
        PLURAL,
        wakeups=wakeups,
        one_pass=one_pass,
        on_error=logged_errors("pipeline", logger),
        backoff_s=options.poll_seconds,
        ids=("pipeline_daemon", "pipeline_updated", "pipeline-wake-on-generation"),
    )

    @kopf.on.event(
        GROUP,
        VERSION,
        MODELS,
        id="wake-pipeline-on-stage",
        labels={LABEL_PIPELINE: kopf.PRESENT},
        registry=registry,
    )
    async def stage_changed(meta: kopf.Meta, **kwargs: Any) -> None:
        if wakeups.changed(meta, kwargs.get("type")):
            wake_owner(meta)

    return wake_owner
