"""Measure one profile point on its layout: every timed instance in lockstep rounds.

A round starts every timed instance's batch at once (as the dispatcher starts a plan's
instances on one split batch) and waits for all of them; each instance's batch time is one
sample, so a round of n co-located instances gives n samples. The filler (the remainder
cores, see :mod:`.layout`) is kept busy with batches of its own, untimed and never waited
for. The stopping rule is the profiler's: at least ``min_samples`` rounds and a 95% CI of
the mean within the precision, or the point's budget. Workers come from a
:class:`~packrat.profiler.client.WorkerSource` (forked from a process with the model built,
or fresh) and are checked for their pinning before anything is timed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from packrat.plan.profile import ProfilePoint
from packrat.profiler.client import Worker, WorkerSource
from packrat.profiler.errors import ProfilerError
from packrat.profiler.layout import PointLayout
from packrat.profiler.stats import mean, precise_enough, summarize

if TYPE_CHECKING:
    from packrat.profiler.profiler import ProfileSettings

__all__ = ["Lockstep", "measure_layout", "start_workers"]


def start_workers(
    source: WorkerSource, wanted: Sequence[tuple[int, Sequence[int]]], *, timeout: float
) -> list[Worker]:
    """Workers for every (threads, cores), started together, each checked: pinned to exactly
    its cores (every thread, pools included) with its thread counts."""
    workers: list[Worker] = []
    try:
        for threads, cores in wanted:
            workers.append(source.spawn(cpus=cores, threads=threads))
        for worker, (threads, cores) in zip(workers, wanted, strict=True):
            ready = worker.wait_ready(timeout=timeout)
            check_pinning(ready, cores=cores, threads=threads)
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


def check_pinning(ready: dict[str, Any], *, cores: Sequence[int], threads: int) -> None:
    """Raise unless a worker's ready report shows exactly ``cores`` and ``threads``."""
    wanted = sorted(cores)
    every = ready.get("thread_affinity", ready.get("affinity"))
    if sorted(ready["affinity"]) != wanted or ready["threads"] != threads:
        raise ProfilerError(
            f"worker pinned to {ready['affinity']} with {ready['threads']} threads, "
            f"expected {wanted} with {threads}"
        )
    if every is not None and not set(every) <= set(wanted):
        raise ProfilerError(f"a worker thread may run on {every}, outside its cores {wanted}")
    if ready.get("interop_threads", 1) != 1:
        raise ProfilerError(f"worker has {ready['interop_threads']} inter-op threads, not 1")


class Lockstep:
    """Rounds over timed workers, with an optional untimed filler kept busy."""

    def __init__(
        self, timed: Sequence[Worker], *, batch: int, filler: Worker | None, timeout: float
    ) -> None:
        self.timed = list(timed)
        self.batch = batch
        self.filler = filler
        self.timeout = timeout
        self._filler_busy = False
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def _feed_filler(self) -> None:
        if self.filler is None:
            return
        if self._filler_busy and self.filler.poll() is not None:
            self._filler_busy = False
        if not self._filler_busy:
            self.filler.send({"cmd": "run", "batch": self.batch})
            self._filler_busy = True

    def round(self) -> list[float]:
        """One round: every timed instance's batch time (ms), in worker order."""
        self._feed_filler()
        for worker in self.timed:
            worker.send({"cmd": "run", "batch": self.batch})
        replies = [w.recv(timeout=self.timeout) for w in self.timed]
        out = []
        for reply in replies:
            wall = float(reply["end"]) - float(reply["start"])
            self.wall_s += wall
            self.cpu_s += float(reply.get("cpu_s", 0.0))
            out.append(wall * 1000.0)
        return out


def measure_layout(
    source: WorkerSource,
    layout: PointLayout,
    *,
    batch: int,
    settings: ProfileSettings,
    budget_s: float,
) -> tuple[ProfilePoint, dict[str, Any]]:
    """Measure point (layout.threads, batch); returns the point and a report."""
    t = layout.threads
    wanted: list[tuple[int, Sequence[int]]] = [(t, cores) for cores in layout.timed]
    if layout.filler:
        wanted.append((len(layout.filler), layout.filler))
    began = time.monotonic()
    workers = start_workers(source, wanted, timeout=settings.startup_timeout_s)
    startup_s = time.monotonic() - began
    timed = workers[: layout.instances]
    filler = workers[layout.instances] if layout.filler else None
    # a batch may be slow, but never pathologically: budget plus generous slack
    steps = Lockstep(timed, batch=batch, filler=filler, timeout=budget_s * 3 + 600)
    try:
        measured_from = time.monotonic()
        samples, slowest, stopped = _sample(
            steps, settings, measured_from=measured_from, budget_s=budget_s
        )
        elapsed = time.monotonic() - measured_from
    finally:
        if filler is not None:
            filler.kill()  # busy with an untimed batch: no reason to wait for it
        for worker in timed:
            worker.close()
    summary = summarize(samples)
    point = ProfilePoint(
        threads=t,
        batch=batch,
        latency_ms=summary.mean,
        samples=summary.n,
        p50_ms=summary.p50,
        p99_ms=summary.p99,
        cv=summary.cv,
    )
    report = {
        "ready": workers[0].ready,
        "readies": [w.ready for w in workers],
        "startup_s": startup_s,
        "stopped": stopped,
        "rel_ci": summary.rel_ci,
        # CPU time / (wall time x threads) of the timed batches: well below 1 means the
        # cores were shared with other work and the latencies are inflated
        "cpu_share": steps.cpu_s / (steps.wall_s * t) if steps.wall_s > 0 else None,
        "elapsed_s": elapsed,
        "instances": layout.instances,
        "filler": len(layout.filler),
        "rounds": len(slowest),
        # the mean of each round's slowest instance: what a plan of n such instances waits
        "slowest_ms": mean(slowest),
    }
    return point, report


def _sample(
    steps: Lockstep, settings: ProfileSettings, *, measured_from: float, budget_s: float
) -> tuple[list[float], list[float], str]:
    """Warm up, then run lockstep rounds until the mean is precise enough, the point's
    budget (from ``measured_from``) ends or max_samples were taken: every instance's
    latencies, each round's slowest, and why it stopped."""
    for _ in range(settings.warmup):
        steps.round()
    steps.cpu_s = steps.wall_s = 0.0
    samples: list[float] = []
    slowest: list[float] = []
    stopped = "max_samples"
    while len(samples) < settings.max_samples:
        values = steps.round()
        samples += values
        slowest.append(max(values))
        enough = len(slowest) >= settings.min_samples
        if enough and precise_enough(
            samples, precision=settings.precision, min_samples=settings.min_samples
        ):
            stopped = "precision"
            break
        if time.monotonic() - measured_from >= budget_s:
            stopped = "budget"
            break
    return samples, slowest, stopped
