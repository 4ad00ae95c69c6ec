"""Load for a serving endpoint: closed-loop bursts and open-loop Poisson arrivals.

Packrat's latency is the latency of a *batch*: B requests arriving together are done when
the last of them is answered. :func:`run_bursts` measures exactly that (burst after burst,
closed loop). :func:`run_poisson` offers requests at a rate regardless of answers (open
loop), the way real traffic arrives, and records each request. Both return dataclasses with
per-request records (time sent, latency, status) so the CLI, the serving benchmark and the
operator's zero-failure switch test reuse them; nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request: when it was sent (s since the run started), how long it took, its status.

    ``status`` is 0 when no HTTP answer came back (connection refused, reset, timeout);
    ``error`` then says why.
    """

    sent_s: float
    latency_s: float
    status: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent_s": self.sent_s,
            "latency_s": self.latency_s,
            "status": self.status,
            **({"error": self.error} if self.error else {}),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stats_ms(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    return {
        "mean_ms": statistics.fmean(ms) if ms else math.nan,
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms) if ms else math.nan,
        "max_ms": max(ms) if ms else math.nan,
    }


def _error_counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = str(r.status) if r.status else "connection"
            counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass
class BurstResult:
    """Closed-loop bursts: ``batch_latencies_s[i]`` is when the last answer of burst i came."""

    burst: int
    bursts: int
    batch_latencies_s: list[float] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "bursts",
            "burst": self.burst,
            "bursts": self.bursts,
            "requests": len(self.records),
            "errors": self.errors,
            "errors_by_status": _error_counts(self.records),
            "batch_latency": _stats_ms(self.batch_latencies_s),
            "request_latency": _stats_ms([r.latency_s for r in self.records]),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "batch_latencies_s": self.batch_latencies_s,
            "records": [r.to_dict() for r in self.records],
        }


@dataclass
class PoissonResult:
    """Open-loop Poisson arrivals at ``rate`` requests per second for ``duration_s``."""

    rate: float
    duration_s: float
    records: list[RequestRecord] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    def summary(self) -> dict[str, Any]:
        ok = [r.latency_s for r in self.records if r.ok]
        return {
            "mode": "poisson",
            "rate": self.rate,
            "duration_s": self.duration_s,
            "requests": len(self.records),
            "achieved_rate": len(self.records) / self.elapsed_s if self.elapsed_s else 0.0,
            "errors": self.errors,
            "errors_by_status": _error_counts(self.records),
            "request_latency": _stats_ms(ok),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "records": [r.to_dict() for r in self.records]}


@dataclass(frozen=True)
class Target:
    """What every kind of run (bursts, Poisson, trace) sends, and where."""

    url: str
    """The endpoint's base URL; requests go to ``{url}/predictions/{model}``."""
    model: str
    """The model's name in that path."""
    body: bytes
    """Every request's body."""
    content_type: str = "application/octet-stream"
    """The body's Content-Type."""
    timeout_s: float = 120.0
    """How long one request may take, s (then it is recorded as failed, status 0)."""

    def session(self, concurrency: int) -> aiohttp.ClientSession:
        """A client session for up to ``concurrency`` requests at once."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(concurrency, 1) * 2),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )

    async def send(self, session: aiohttp.ClientSession, origin: float) -> RequestRecord:
        """One request, recorded with its send time in seconds since ``origin``."""
        where = f"{self.url.rstrip('/')}/predictions/{self.model}"
        headers = {"Content-Type": self.content_type}
        sent = time.perf_counter()
        try:
            async with session.post(where, data=self.body, headers=headers) as resp:
                await resp.read()
                status, error = resp.status, None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            status, error = 0, f"{type(exc).__name__}: {exc}"
        done = time.perf_counter()
        return RequestRecord(
            sent_s=sent - origin, latency_s=done - sent, status=status, error=error
        )


async def run_bursts(
    target: Target, *, burst: int, bursts: int, warmup_bursts: int = 0, pause_s: float = 0.0
) -> BurstResult:
    """``bursts`` times: send ``burst`` requests at once and wait for every answer.

    ``warmup_bursts`` extra bursts run first and are not recorded.
    """
    if burst < 1 or bursts < 1:
        raise ValueError("burst and bursts must be >= 1")
    result = BurstResult(burst=burst, bursts=bursts)
    async with target.session(burst) as session:
        origin = time.perf_counter()
        for i in range(warmup_bursts + bursts):
            start = time.perf_counter()
            records = await asyncio.gather(*(target.send(session, origin) for _ in range(burst)))
            elapsed = time.perf_counter() - start
            if i >= warmup_bursts:
                result.batch_latencies_s.append(elapsed)
                result.records.extend(records)
            if pause_s:
                await asyncio.sleep(pause_s)
    return result


async def run_poisson(
    target: Target, *, rate: float, duration_s: float, seed: int = 0, max_outstanding: int = 10_000
) -> PoissonResult:
    """Send requests with exponential inter-arrival times (mean ``1/rate``) for ``duration_s``.

    Open loop: arrivals never wait for answers (beyond ``max_outstanding``, a safety cap, the
    generator itself would be the bottleneck, so it waits and says so in the result count).
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    rng = random.Random(seed)
    result = PoissonResult(rate=rate, duration_s=duration_s)
    tasks: list[asyncio.Task[RequestRecord]] = []
    outstanding = {"n": 0}
    async with target.session(min(max_outstanding, 1000)) as session:
        origin = time.perf_counter()
        next_at = 0.0
        while True:
            next_at += rng.expovariate(rate)
            if next_at >= duration_s:
                break
            delay = origin + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            while outstanding["n"] >= max_outstanding:
                await asyncio.sleep(0.001)
            task = asyncio.create_task(target.send(session, origin))
            outstanding["n"] += 1
            task.add_done_callback(lambda _t: outstanding.__setitem__("n", outstanding["n"] - 1))
            tasks.append(task)
        records = await asyncio.gather(*tasks)
        result.elapsed_s = time.perf_counter() - origin
    result.records = sorted(records, key=lambda r: r.sent_s)
    return result


def format_summary(summary: dict[str, Any]) -> str:
    """A small human-readable table of a burst or Poisson summary."""
    lines = []
    if summary["mode"] == "bursts":
        b = summary["batch_latency"]
        lines.append(f"bursts of {summary['burst']} x {summary['bursts']}")
        lines.append(f"{'':24}{'mean':>10}{'p50':>10}{'p99':>10}{'max':>10}")
        lines.append(
            f"{'batch latency (ms)':24}{b['mean_ms']:10.2f}{b['p50_ms']:10.2f}"
            f"{b['p99_ms']:10.2f}{b['max_ms']:10.2f}"
        )
    else:
        lines.append(
            f"{summary['mode']} {summary['rate']:.1f} req/s for {summary['duration_s']:.1f} s "
            f"(achieved {summary['achieved_rate']:.1f} req/s)"
        )
        lines.append(f"{'':24}{'mean':>10}{'p50':>10}{'p99':>10}{'max':>10}")
    r = summary["request_latency"]
    lines.append(
        f"{'request latency (ms)':24}{r['mean_ms']:10.2f}{r['p50_ms']:10.2f}"
        f"{r['p99_ms']:10.2f}{r['max_ms']:10.2f}"
    )
    by_status = summary["errors_by_status"] or ""
    lines.append(f"requests {summary['requests']}, errors {summary['errors']} {by_status}")
    return "\n".join(lines)
