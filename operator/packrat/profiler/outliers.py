"""Points a profile should not be written with: non-monotone in the batch, or spikes.

Pure functions over measured points. Interference only ever inflates a latency, so the
suspect of a broken pair is the higher point, and a re-measurement keeps the lower mean:

- monotone in the batch: for a fixed thread count a bigger batch never takes less time, so
  L(t, b_i) > L(t, b_(i+1)) beyond the noise flags (t, b_i);
- no spike along the batch: for any power law L = c * b^p on a doubling grid the mean of the
  two neighbours is at least the middle point, so L(t, b_i) above that mean beyond the noise
  flags it;
- no spike along the threads: L(t, b) above both L(t-1, b) and L(t+1, b) beyond the noise.

The noise allowance of a comparison is ``max(floor, 2 x (relative CI of both points))``, the
relative CI estimated from each point's coefficient of variation and sample count.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from packrat.plan.profile import ProfilePoint
from packrat.profiler.stats import t_critical

__all__ = ["Suspect", "better_point", "find_suspects", "noise"]

NOISE_FLOOR = 0.05  # 5%: below this, differences are the machine's ordinary jitter

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Suspect:
    key: Key
    rule: str  # non-monotone | batch-spike | thread-spike
    detail: str

    @property
    def blocking(self) -> bool:
        """A monotonicity break is impossible on quiet cores: the profile is not stored."""
        return self.rule == "non-monotone"


def _rel_ci(point: ProfilePoint) -> float:
    if not point.samples or point.samples < 2 or point.cv is None:
        return 0.0
    return t_critical(point.samples - 1) * point.cv / math.sqrt(point.samples)


def noise(a: ProfilePoint, b: ProfilePoint, *, floor: float = NOISE_FLOOR) -> float:
    return max(floor, 2.0 * (_rel_ci(a) + _rel_ci(b)))


def find_suspects(
    points: Mapping[Key, ProfilePoint], *, floor: float = NOISE_FLOOR
) -> list[Suspect]:
    """Every suspect point, each once (the first rule that flags it), in grid order."""
    found: dict[Key, Suspect] = {}

    def flag(key: Key, rule: str, detail: str) -> None:
        found.setdefault(key, Suspect(key, rule, detail))

    threads = sorted({t for t, _ in points})
    for t in threads:
        row = sorted((b, p) for (tt, b), p in points.items() if tt == t)
        for (b0, p0), (b1, p1) in itertools.pairwise(row):
            if p0.latency_ms > p1.latency_ms * (1 + noise(p0, p1, floor=floor)):
                flag(
                    p0.key,
                    "non-monotone",
                    f"t={t}: batch {b0} took {p0.latency_ms:.2f} ms, more than batch {b1} "
                    f"({p1.latency_ms:.2f} ms)",
                )
        for (_, lo), (b, mid), (_, hi) in zip(row, row[1:], row[2:], strict=False):
            bound = (lo.latency_ms + hi.latency_ms) / 2
            allowance = max(noise(lo, mid, floor=floor), noise(mid, hi, floor=floor))
            if mid.latency_ms > bound * (1 + allowance):
                flag(
                    mid.key,
                    "batch-spike",
                    f"t={t} b={b}: {mid.latency_ms:.2f} ms, above its neighbours' mean "
                    f"{bound:.2f} ms",
                )
    batches = sorted({b for _, b in points})
    for b in batches:
        col = sorted((t, p) for (t, bb), p in points.items() if bb == b)
        for (t0, lo), (t, mid), (t1, hi) in zip(col, col[1:], col[2:], strict=False):
            if t0 != t - 1 or t1 != t + 1:
                continue
            top = max(lo.latency_ms, hi.latency_ms)
            allowance = max(noise(lo, mid, floor=floor), noise(mid, hi, floor=floor))
            if mid.latency_ms > top * (1 + allowance):
                flag(
                    mid.key,
                    "thread-spike",
                    f"b={b} t={t}: {mid.latency_ms:.2f} ms, slower than both t={t0} and t={t1}",
                )
    return [found[k] for k in sorted(found, key=lambda k: (k[1], k[0]))]


def better_point(old: ProfilePoint, new: ProfilePoint) -> ProfilePoint:
    """Of two measurements of one point, the less disturbed one (the lower mean)."""
    return new if new.latency_ms < old.latency_ms else old
