"""A plain-text progress bar with ETA on stderr (no dependencies).

On a terminal the bar redraws in place; in a pod's log (not a tty) it prints one line per
step, so ``kubectl logs`` of a profiling Job shows how far it got and how long is left, and
after it the same as data (:class:`packrat.plan.profile.ProgressRecord`, one JSON line), which
the operator reads back for ``status.profiling.progress``. The records are for logs, never for
a person: ``records`` turns them on or off (default: only when the stream is not a terminal;
the operator's Job asks for them, ``packrat demo`` does not).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from packrat.plan.profile import ProfilePoint, ProgressRecord

if TYPE_CHECKING:
    from packrat.profiler.profiler import ProfileSettings


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def bar(done: int, total: int, width: int = 24) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Progress:
    """Counts steps of a known total and estimates the time left from the time per step."""

    def __init__(
        self,
        total: int,
        *,
        stream: TextIO | None = None,
        label: str = "profile",
        records: bool | None = None,
    ) -> None:
        self.total = total
        self.done = 0
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.records = not self._tty if records is None else records
        self._measured_time = 0.0
        self._measured = 0

    def eta(self, *, cap: float | None = None, estimate: float | None = None) -> float:
        """Seconds left: the caller's ``estimate`` if given, else the mean time per measured
        step x steps left; capped by ``cap`` (e.g. what is left of a time budget)."""
        left = self.total - self.done
        if left <= 0:
            return 0.0
        if estimate is not None:
            return estimate if cap is None else min(estimate, cap)
        if self._measured == 0:
            return float("inf") if cap is None else cap
        by_mean = self._measured_time / self._measured * left
        return by_mean if cap is None else min(by_mean, cap)

    def step(
        self,
        message: str,
        *,
        seconds: float | None = None,
        cap: float | None = None,
        estimate: float | None = None,
    ) -> None:
        """One step done; ``seconds`` is its duration (None: skipped, not counted in the ETA)."""
        self.done += 1
        if seconds is not None:
            self._measured += 1
            self._measured_time += seconds
        self.show(message, cap=cap, estimate=estimate)

    def show(
        self, message: str, *, cap: float | None = None, estimate: float | None = None
    ) -> None:
        elapsed = time.monotonic() - self.started
        eta = self.eta(cap=cap, estimate=estimate)
        line = (
            f"{self.label} {bar(self.done, self.total)} {self.done}/{self.total} "
            f"elapsed {format_duration(elapsed)} "
            f"ETA {format_duration(eta)}  "
            f"{message}"
        )
        if self._tty:
            self.stream.write("\r\x1b[2K" + line)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        if self.records:
            if self._tty:
                self.stream.write("\n")
            self.stream.write(self.record(elapsed, eta).to_line() + "\n")
        self.stream.flush()

    def record(self, elapsed: float, eta: float) -> ProgressRecord:
        """This progress as data (for the operator: ``status.profiling.progress``)."""
        return ProgressRecord(
            done=self.done,
            total=self.total,
            elapsed_seconds=max(0, round(elapsed)),
            eta_seconds=max(0, round(eta)) if math.isfinite(eta) else None,
        )

    def finish(self, message: str = "") -> None:
        if self._tty and self.done < self.total:
            self.stream.write("\n")
        if message:
            self.stream.write(message + "\n")
        self.stream.flush()


def estimate_seconds(
    todo: Sequence[tuple[int, int]],
    points: dict[tuple[int, int], ProfilePoint],
    *,
    settings: ProfileSettings,
    startup_s: float,
) -> float | None:
    """Time the points in ``todo`` will take, extrapolated from the points measured so far.

    L(t, b) is taken as linear in b from the largest measured batch with the same t (or any
    t, scaled by threads); a point costs start-up + (warm-up + samples) x L, capped by the
    per-point budget. None until at least one point is known.
    """
    if not points:
        return None
    samples = [p.samples for p in points.values() if p.samples] or [settings.min_samples]
    typical_n = max(settings.min_samples, sum(samples) / len(samples))
    total = 0.0
    for t, b in todo:
        same = [p for p in points.values() if p.threads == t]
        ref = max(same or points.values(), key=lambda p: (p.batch, -abs(p.threads - t)))
        latency_s = ref.latency_ms / 1000.0 * b / ref.batch
        if not same:
            latency_s *= ref.threads / t
        work = (settings.warmup + typical_n) * latency_s
        total += startup_s + min(settings.point_budget_s + latency_s, work)
    return total
