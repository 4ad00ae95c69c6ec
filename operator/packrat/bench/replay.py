"""Open-loop replay of an arrival trace against a serving endpoint (``packrat loadgen --trace``).

Each request is sent at its trace timestamp (seconds from the first arrival, shifted to 0),
whatever the answers do, the way the planner's simulation assumes traffic arrives; so
measured and simulated latencies of the same trace compare directly. Records as in
:mod:`packrat.bench.loadgen`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packrat.bench.loadgen import PoissonResult, RequestRecord, Target


@dataclass
class TraceResult(PoissonResult):
    """Open-loop replay of ``arrivals`` timestamps; ``rate`` is the trace's mean rate."""

    late_s: float = 0.0  # how far behind schedule the latest send was (generator overload)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "mode": "trace", "max_send_lag_ms": self.late_s * 1000.0}


async def run_trace(
    target: Target, *, arrivals_s: Sequence[float], max_outstanding: int = 10_000
) -> TraceResult:
    """Send one request at each of ``arrivals_s`` (sorted seconds, shifted to start at 0)."""
    times = [float(t) for t in arrivals_s]
    if not times:
        raise ValueError("the trace has no arrivals")
    if any(b < a for a, b in itertools.pairwise(times)):
        raise ValueError("trace timestamps must be sorted")
    first = times[0]
    offsets = [t - first for t in times]
    span = offsets[-1]
    result = TraceResult(rate=(len(offsets) - 1) / span if span > 0 else 0.0, duration_s=span)
    tasks: list[asyncio.Task[RequestRecord]] = []
    outstanding = {"n": 0}

    def finished(_task: asyncio.Task[RequestRecord]) -> None:
        outstanding["n"] -= 1

    async with target.session(min(max_outstanding, 1000)) as session:
        origin = time.perf_counter()
        for at in offsets:
            delay = origin + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                result.late_s = max(result.late_s, -delay)
            while outstanding["n"] >= max_outstanding:
                await asyncio.sleep(0.001)
            task = asyncio.create_task(target.send(session, origin))
            outstanding["n"] += 1
            task.add_done_callback(finished)
            tasks.append(task)
        records = await asyncio.gather(*tasks)
        result.elapsed_s = time.perf_counter() - origin
    result.records = sorted(records, key=lambda r: r.sent_s)
    return result
