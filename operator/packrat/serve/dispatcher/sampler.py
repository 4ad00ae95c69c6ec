"""The dispatcher's batch-size estimator sampling loop (Packrat's estimator,
:class:`~packrat.plan.estimator.BatchSizeEstimator`): the outstanding requests (queued + in
flight) every few milliseconds while there are any, exported as gauges."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from packrat.plan.estimator import BatchSizeEstimator
from packrat.serve.dispatcher.metrics import ServeMetrics

__all__ = ["EstimatorSampler", "ticks"]


MAX_TICKS = 40
"""The most ticks one late sample stands for (0.2 s at 5 ms): a stall longer than that is not
taken for a depth held all along."""


def ticks(elapsed_s: float, interval_s: float) -> int:
    """How many sampling ticks ``elapsed_s`` since the last sample stands for (at least one,
    at most :data:`MAX_TICKS`).

    The sampler is an asyncio task beside the requests it counts: on a busy event loop its
    5 ms sleep takes 20-40 ms, and an estimator whose window is counted in samples would then
    take several seconds, not one, to follow a change. Counting the ticks a late sample
    missed (the depth it sees held meanwhile) keeps the window about one second long.
    """
    if not elapsed_s > 0 or interval_s <= 0:
        return 1
    return max(1, min(MAX_TICKS, round(elapsed_s / interval_s)))


class EstimatorSampler:
    """Feeds ``estimator`` the count ``pending()`` returns, every ``interval_s`` while it is
    not zero; :meth:`wake` says something became outstanding."""

    def __init__(
        self,
        estimator: BatchSizeEstimator,
        *,
        pending: Callable[[], int],
        interval_s: float,
        metrics: ServeMetrics,
        model: str,
    ) -> None:
        self.estimator = estimator
        self.interval_s = interval_s
        self._pending = pending
        self._metrics = metrics
        self._model = model
        self._task: asyncio.Task[None] | None = None
        self._busy = asyncio.Event()  # set while anything is outstanding: the loop runs
        self._held: tuple[int, float] = (estimator.estimate, time.monotonic())

    def stable_s(self) -> float:
        """Seconds the estimate has held its current value (the operator's fast trigger acts
        on an estimate held for a second, as the Packrat paper's 1 s timeout)."""
        value, since = self._held
        now = time.monotonic()
        if self.estimator.estimate != value:
            self._held = (self.estimator.estimate, now)
            return 0.0
        return now - since

    def wake(self) -> None:
        self._busy.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        """Idle samples (nothing outstanding) are skipped: they say nothing about the size of
        the batches that arrive, and between closed-loop bursts of exactly B they would pull
        the average just below B, which floors to B/2. While idle the loop sleeps until a
        request arrives (no 5 ms tick on an idle pod).
        """
        m = self._metrics
        estimate = m.batch_size_estimate.labels(self._model)
        ewma = m.outstanding_ewma.labels(self._model)
        last = time.monotonic()
        while True:
            depth = self._pending()
            now = time.monotonic()
            if depth > 0:
                self.estimator.observe(depth, times=ticks(now - last, self.interval_s))
                self.stable_s()  # notes when the estimate changed
            last = now
            estimate.set(self.estimator.estimate)
            ewma.set(self.estimator.ewma)
            if depth == 0:
                self._busy.clear()
                await self._busy.wait()
                last = time.monotonic()  # the idle time is no sample
            await asyncio.sleep(self.interval_s)
