"""The dispatcher's slots: which instance takes a request, and the bounded FIFO before that.

Each instance holds at most ``caps[i]`` outstanding requests (two batches by default, see
:mod:`packrat.serve.dispatcher.routing`); the rest wait here, in arrival order, at most
``queue_limit``
of them, each at most ``queue_timeout_s``. A waiter that gives up (its client left, its
deadline passed) is removed before it takes a slot, so an abandoned request never reaches a
worker. :meth:`Slots.fail` answers every waiter at once when the backend is gone.

Pure asyncio: no HTTP, no metrics (the owner reads :attr:`Slots.queued` and
:attr:`Slots.in_flight` after each change, through ``on_change``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence

from packrat.serve.dispatcher.routing import choose_instance, default_caps


class QueueFullError(Exception):
    """The dispatcher's queue is at its limit."""


class BackendGoneError(Exception):
    """The backend is gone; nothing queued will ever be served."""


STUCK_AFTER_S = 60.0


class Slots:
    """Outstanding requests per instance, and the queue of requests waiting for a slot."""

    def __init__(
        self,
        batches: Sequence[int],
        *,
        queue_limit: int,
        queue_timeout_s: float,
        on_change: Callable[[], None] = lambda: None,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        if queue_limit < 0:
            raise ValueError("queue_limit must be >= 0")
        # an instance with requests outstanding and no answer for this long is stuck (a hung
        # handler): it gets no new request and the pod is not ready until it answers again
        self.stuck_after_s = stuck_after_s
        self.progress = [0.0] * len(batches)  # when each last began work or answered
        self.batches = list(batches)
        self.caps = default_caps(self.batches)
        self.queue_limit = queue_limit
        self.queue_timeout_s = queue_timeout_s
        self.outstanding = [0] * len(self.batches)
        self.up = [False] * len(self.batches)
        self.failed: str | None = None
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_change = on_change

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def in_flight(self) -> int:
        return sum(self.outstanding)

    @property
    def pending(self) -> int:
        """Outstanding requests: queued plus in flight."""
        return self.in_flight + len(self._waiters)

    def set_up(self, index: int, up: bool) -> None:
        self.up[index] = up
        if up:
            self._dispatch()

    def admissible(self) -> bool:
        """Whether a new request could take a slot or a place in the queue right now."""
        if self.failed:
            return False
        if len(self._waiters) < self.queue_limit:
            return True
        return not self._waiters and self._choose() is not None

    def fail(self, reason: str) -> None:
        """The backend is gone: every waiter (and every later acquire) raises at once."""
        self.failed = reason
        self.up = [False] * len(self.up)
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(BackendGoneError(reason))
        self._changed()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is outstanding; False when ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def acquire(self) -> int:
        """An instance index for one request: at once, or after waiting in the queue.

        Raises :class:`QueueFullError`, :class:`BackendGoneError`, ``TimeoutError`` (waited
        ``queue_timeout_s``) or ``CancelledError`` (the caller gave up); in every case the
        request holds no slot and is no longer queued.
        """
        if self.failed:
            raise BackendGoneError(self.failed)
        if not self._waiters:
            index = self._choose()
            if index is not None:
                self._take(index)
                self._changed()
                return index
        if len(self._waiters) >= self.queue_limit:
            raise QueueFullError
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._idle.clear()
        self._changed()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())  # assigned just as we gave up: hand it back
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
                self._changed()
            raise

    def release(self, index: int) -> None:
        self.outstanding[index] -= 1
        self.progress[index] = time.monotonic()
        self._dispatch()

    def stuck(self) -> list[int]:
        """The instances with requests outstanding and no answer for ``stuck_after_s``."""
        now = time.monotonic()
        return [
            i
            for i, n in enumerate(self.outstanding)
            if n > 0 and now - self.progress[i] > self.stuck_after_s
        ]

    # -- internals ---------------------------------------------------------------------------
    def _choose(self) -> int | None:
        stuck = self.stuck()
        up = [u and i not in stuck for i, u in enumerate(self.up)] if stuck else self.up
        return choose_instance(self.outstanding, self.batches, up=up, caps=self.caps)

    def _take(self, index: int) -> None:
        if self.outstanding[index] == 0:
            self.progress[index] = time.monotonic()
        self.outstanding[index] += 1
        self._idle.clear()

    def _dispatch(self) -> None:
        while self._waiters:
            index = self._choose()
            if index is None:
                break
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take(index)
            fut.set_result(index)
        self._changed()

    def _changed(self) -> None:
        if self.pending == 0:
            self._idle.set()
        self._on_change()
