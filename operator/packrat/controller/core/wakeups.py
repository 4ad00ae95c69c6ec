"""Which model's daemon a watch event wakes, when a re-listed child is no news, and the
daemon's loop of passes (:func:`run_passes`) and the wiring around it
(:func:`register_daemon`), shared by PackratModels and PackratPipelines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from packrat.controller.api.backoff import backoff
from packrat.controller.api.crd import GROUP, VERSION

MAX_BACKOFF_SECONDS = 60.0


class Wakeups:
    """One asyncio.Event per model; a watch event on a child sets its model's.

    Every watch stream starts by listing its objects again after each reconnect (every few
    minutes): kopf delivers them as events of type None, and a watch that replays (the
    emulator's, or a real one restarted from an expired resourceVersion) as ADDED. A child
    listed or added at the resourceVersion already seen wakes nobody, so reconnects cost no
    pass per model; anything new or changed still wakes its model at once."""

    MAX_SEEN = 100_000  # bounds the memory of resourceVersions (cleared when exceeded)

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._seen: dict[str, str] = {}
        self._woken_for: dict[str, Any] = {}  # model key -> the generation last woken for

    def unobserved(self, key: str, body: Mapping[str, Any]) -> bool:
        """Whether a model's own watch event shows a generation its status has not observed
        and that has not woken it yet. kopf's update handler fires only when the spec's
        content differs from the last one handled; a patch that bumps the generation without
        that (a field set to what it already was, a spec put back) would otherwise wait for
        the resync, leaving ``observedGeneration`` behind."""
        generation = (body.get("metadata") or {}).get("generation")
        observed = (body.get("status") or {}).get("observedGeneration")
        if generation is None or generation == observed:
            return False
        if self._woken_for.get(key) == generation:
            return False
        self._woken_for[key] = generation
        return True

    def changed(self, meta: Mapping[str, Any], event_type: str | None) -> bool:
        """Whether a child's watch event is news (false only for an unchanged re-listing)."""
        uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        if not uid or not version:
            return True
        if event_type == "DELETED":
            self._seen.pop(uid, None)
            return True
        if event_type in (None, "ADDED") and self._seen.get(uid) == version:
            return False
        if len(self._seen) >= self.MAX_SEEN:
            self._seen.clear()
        self._seen[uid] = version
        return True

    def forget(self, meta: Mapping[str, Any]) -> None:
        """The child's next listing is news again (what it woke failed)."""
        self._seen.pop(str(meta.get("uid") or ""), None)

    def get(self, key: str) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def wake(self, key: str) -> bool:
        """Wake the model's daemon; False when it has none (gone, being deleted, not yet
        started)."""
        event = self._events.get(key)
        if event is not None:
            event.set()
        return event is not None

    def drop(self, key: str) -> None:
        self._events.pop(key, None)
        self._woken_for.pop(key, None)


async def run_passes(
    stopped: object,
    event: asyncio.Event,
    one_pass: Callable[[], Awaitable[float | None]],
    *,
    backoff_s: float,
    on_error: Callable[[Exception, int], None],
    seed: str = "",
) -> None:
    """A daemon's loop until ``stopped`` (kopf's flag) is set: a pass, then a wait for a
    wake-up (``event``) or the delay the pass returned; None means the object is gone and the
    loop ends. A pass that raises is reported (``on_error(exc, failures in a row)``) and
    retried after ``backoff_s`` doubled per failure, up to :data:`MAX_BACKOFF_SECONDS`, with
    jitter (:func:`packrat.controller.api.backoff.backoff`, seeded by ``seed``)."""
    failures = 0
    while not stopped:
        event.clear()
        try:
            delay = await one_pass()
        except Exception as exc:
            failures += 1
            on_error(exc, failures)
            delay = backoff(failures, base=backoff_s, cap=MAX_BACKOFF_SECONDS, seed=seed)
        else:
            failures = 0
            if delay is None:
                return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=delay)


OnError = Callable[[str, str, Exception, int], None]
"""(namespace, name, the exception, failures in a row) -> None: a failed pass, retried."""


def logged_errors(what: str, log: logging.Logger) -> OnError:
    """An ``on_error`` that logs a failed pass of a ``what`` (the daemon retries it)."""

    def on_error(namespace: str, name: str, exc: Exception, failures: int) -> None:
        log.warning(
            "reconcile of %s %s/%s failed (%s), retrying: %s", what, namespace, name, failures, exc
        )

    return on_error


OnePass = Callable[[kopf.Body, str, str], Awaitable[float | None]]
"""(the object's body, namespace, name) -> seconds until the next pass, None when gone."""


def register_daemon(
    registry: kopf.OperatorRegistry,
    plural: str,
    *,
    wakeups: Wakeups,
    one_pass: OnePass,
    on_error: Callable[[str, str, Exception, int], None],
    backoff_s: float,
    ids: tuple[str, str, str],
) -> None:
    """The wiring every Packrat custom resource gets: one daemon per object running its
    passes (:func:`run_passes`, woken through ``wakeups``), and the object's own update and
    watch events waking it (a new generation not observed yet). ``ids``: the kopf handler ids
    of the daemon, the update handler and the event handler (kept stable across releases:
    kopf keys its progress annotations by them)."""
    daemon_id, update_id, event_id = ids

    @kopf.daemon(GROUP, VERSION, plural, id=daemon_id, cancellation_timeout=1.0, registry=registry)
    async def daemon(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        meta = body.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta["name"]
        key = f"{namespace}/{name}"
        event = wakeups.get(key)
        try:
            await run_passes(
                stopped,
                event,
                lambda: one_pass(body, namespace, name),
                backoff_s=backoff_s,
                on_error=lambda exc, failures: on_error(namespace, name, exc, failures),
                seed=key,
            )
        finally:
            wakeups.drop(key)

    @kopf.on.update(GROUP, VERSION, plural, id=update_id, registry=registry)
    async def updated(meta: kopf.Meta, **_: Any) -> None:
        wakeups.wake(f"{meta.get('namespace', 'default')}/{meta['name']}")

    @kopf.on.event(GROUP, VERSION, plural, id=event_id, registry=registry)
    async def own_event(body: kopf.Body, meta: kopf.Meta, **kwargs: Any) -> None:
        key = f"{meta.get('namespace', 'default')}/{meta['name']}"
        if kwargs.get("type") != "DELETED" and wakeups.unobserved(key, body):
            wakeups.wake(key)
