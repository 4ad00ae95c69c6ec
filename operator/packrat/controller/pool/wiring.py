"""kopf wiring for PackratPools: one daemon per pool runs its passes; its children, its
members and its own status wake what depends on them.

The same structure as the PackratModel daemon (:mod:`packrat.controller.handlers`): a change
to the pool, to one of its children (found by the ``packrat.dev/pool`` label) or to a model
that asks for it or is served by it wakes the pool's daemon at once; a change to the pool
(its placements, what its pods serve) wakes its models' daemons, which point their Services
at their pool pods. While a model waits for its pod the pool looks again every
``poll_seconds``; a serving pool reads its pods every ``REFRESH_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

import kopf

from packrat.controller.core.context import Result
from packrat.controller.core.spec import GROUP, VERSION
from packrat.controller.core.spec import PLURAL as MODELS
from packrat.controller.core.wakeups import Wakeups, logged_errors, register_daemon
from packrat.controller.pool.manifests import LABEL_POOL
from packrat.controller.pool.reconcile import PLURAL, PoolReconciler
from packrat.controller.pool.spec import pool_of, served_by

logger = logging.getLogger(__name__)

PostEvents = Callable[[kopf.Body, Result], None]


def pool_key(meta: Mapping[str, Any]) -> str | None:
    """The pool a child belongs to (by its ``packrat.dev/pool`` label)."""
    name = (meta.get("labels") or {}).get(LABEL_POOL)
    return f"{meta.get('namespace', 'default')}/{name}" if name else None


class Signatures:
    """The last signature seen per object: an event wakes only when what the other side
    acts on changed (a pool's placements, a model's pool and pod), not when counters did:
    otherwise a pool's status write would wake its models, whose status writes would wake
    the pool, pass after pass while traffic moves the counters."""

    MAX = 100_000

    def __init__(self) -> None:
        self._seen: dict[str, Any] = {}

    def previous(self, key: str) -> Any:
        return self._seen.get(key)

    def news(self, key: str, signature: Any, event_type: str | None) -> bool:
        if event_type == "DELETED":
            self._seen.pop(key, None)
            return True
        if self._seen.get(key) == signature:
            return False
        if len(self._seen) >= self.MAX:
            self._seen.clear()
        self._seen[key] = signature
        return True


def placements(status: Mapping[str, Any]) -> dict[str, Any]:
    """What a pool's models act on: per model its pod and readiness (and why it is over
    capacity), or why it is unplaced."""
    models = status.get("models") or {}
    out: dict[str, Any] = {
        n: (r.get("pod"), r.get("ready"), r.get("overCapacity"))
        for n, r in models.items()
        if isinstance(r, Mapping)
    }
    return {**out, **{n: str(why) for n, why in (status.get("unplaced") or {}).items()}}


def membership(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a pool acts on of a model: the pool it asks for, the pool and pod serving it,
    its plan on the pool's cores (threads, batch, cpus: the pool pod's config)."""
    status = body.get("status") or {}
    record = status.get("pool") or {}
    pod = record.get("pod") if isinstance(record, Mapping) else None
    generation = (body.get("metadata") or {}).get("generation")
    plan = status.get("poolPlan")
    shape = (
        tuple(plan.get(k) for k in ("threads", "batch", "cpus"))
        if isinstance(plan, Mapping)
        else None
    )
    return (pool_of(body), served_by(body), pod, generation, shape)


def register_pools(
    registry: kopf.OperatorRegistry,
    *,
    poll_seconds: float,
    resync_seconds: float,
    pool: Executor,
    reconciler: Callable[[], PoolReconciler],
    wakeups: Wakeups,
    wake_model: Callable[[str], object],
    post_events: PostEvents,
) -> Callable[[Mapping[str, Any]], None]:
    """Add the PackratPool handlers to ``registry``; returns the function the child watches
    call with a changed child's metadata."""

    def wake_owner(meta: Mapping[str, Any]) -> None:
        key = pool_key(meta)
        if key is not None:
            wakeups.wake(key)

    async def one_pass(body: kopf.Body, namespace: str, name: str) -> float | None:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(pool, reconciler().reconcile, namespace, name)
        if result.result == "gone":
            return None
        post_events(body, result)
        if result.waiting:
            return poll_seconds
        return result.retry_seconds or resync_seconds

    register_daemon(
        registry,
        PLURAL,
        wakeups=wakeups,
        one_pass=one_pass,
        on_error=logged_errors("pool", logger),
        backoff_s=poll_seconds,
        ids=("pool_daemon", "pool_updated", "pool-wake-on-generation"),
    )

    seen_pools, seen_models = Signatures(), Signatures()

    @kopf.on.event(GROUP, VERSION, PLURAL, id="wake-models-on-pool", registry=registry)
    async def pool_changed(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> None:
        namespace = meta.get("namespace", "default")
        now = placements(body.get("status") or {})
        key = f"{namespace}/{meta['name']}"
        if seen_pools.news(key, now, kwargs.get("type")):
            for model in now:
                wake_model(f"{namespace}/{model}")

    @kopf.on.event(GROUP, VERSION, MODELS, id="wake-pool-on-model", registry=registry)
    async def model_changed(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> None:
        namespace = meta.get("namespace", "default")
        key = f"{namespace}/{meta['name']}"
        now, before = membership(body), seen_models.previous(key) or (None, None)
        if now[:2] == (None, None) and before[:2] == (None, None):
            return  # a model no pool has to do with
        if seen_models.news(key, now, kwargs.get("type")):
            for name in {*now[:2], *before[:2]} - {None}:  # a pool it left too
                wakeups.wake(f"{namespace}/{name}")

    return wake_owner
