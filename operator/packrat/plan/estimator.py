"""Packrat's batch-size estimator: what batch size the arriving load currently amounts to.

Online reconfiguration needs one number, the batch size B the load presents, that is stable
under noise yet follows a real change in load. Packrat's rule: smooth the sampled queue depth
with an exponentially weighted moving average (alpha 0.1), floor the average to a power of
two (plans exist per power of two, and flooring never overestimates the load), and report
the mode of the last ``window`` floored values, so one spike does not flip the estimate.

``rounding="nearest"`` is the unbiased variant: the nearest power of two on a log scale.
Flooring reads burst-synchronised clients as half the burst whenever the sampled mean depth
falls below the burst size (measured: 2 -> 1, 8 -> 4, 16 -> 8); the nearest power of two
reads any mean depth above ``B / sqrt(2)`` as ``B``, at the price of overestimating a load
just above ``B / sqrt(2)``. The serving pods use ``SERVING_ROUNDING`` (nearest) by
default; floor stays selectable (``spec.autoBatch.rounding``, ``packrat serve
--batch-estimate``).

Pure: the caller samples the queue depth (every few milliseconds in the dispatcher) and
feeds the numbers in; nothing here reads a clock or awaits anything.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

DEFAULT_ALPHA = 0.1
DEFAULT_WINDOW = 200


ROUNDINGS = ("floor", "nearest")
# What the serving pods use unless told otherwise: "nearest" served ResNet-50's stepped
# closed-loop load better than "floor" in the reconfiguration experiment (docs/measurements.md,
# issue 12 item 6); the estimator itself keeps Packrat's floor as its own default.
SERVING_ROUNDING = "nearest"


def nearest_pow2(value: float) -> int:
    """The power of two nearest to ``value`` on a log scale (``round(log2 value)``): the
    unbiased variant. Between 2^k and 2^(k+1) the boundary is the geometric mean
    2^(k+0.5), so 6 reads as 8 and 5.5 as 4; 1 for anything below sqrt(2) (including 0)."""
    if not math.isfinite(value) or value < math.sqrt(2):
        return 1
    exponent = math.floor(math.log2(value) + 0.5)
    return 1 << exponent


def floor_pow2(value: float) -> int:
    """The largest power of two <= ``value``; 1 for anything below 2 (including 0)."""
    if not math.isfinite(value) or value < 2:
        return 1
    return 1 << (int(value).bit_length() - 1)


@dataclass(frozen=True, slots=True)
class EstimatorState:
    """A snapshot for metrics and status endpoints."""

    ewma: float
    estimate: int
    samples: int


class BatchSizeEstimator:
    """EWMA of queue depth, floored to a power of two, mode over the last ``window`` samples.

    ``min_batch``/``max_batch`` clamp the reported estimate (both are powers of two in
    practice; the clamp is applied after flooring). Ties between equally frequent values in
    the window go to the most recently observed one, so the estimate moves on a tie rather
    than sticking to a stale value.
    """

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_ALPHA,
        window: int = DEFAULT_WINDOW,
        min_batch: int = 1,
        max_batch: int | None = None,
        rounding: str = "floor",
    ) -> None:
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if min_batch < 1 or (max_batch is not None and max_batch < min_batch):
            raise ValueError(f"invalid clamp min_batch={min_batch} max_batch={max_batch}")
        self.alpha = alpha
        self.window = window
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.rounding = rounding
        self._round = floor_pow2 if rounding == "floor" else nearest_pow2
        self._ewma: float | None = None
        self._recent: deque[int] = deque(maxlen=window)
        self._counts: Counter[int] = Counter()
        self._samples = 0

    @property
    def ewma(self) -> float:
        return 0.0 if self._ewma is None else self._ewma

    @property
    def samples(self) -> int:
        return self._samples

    def _clamp(self, value: int) -> int:
        value = max(value, self.min_batch)
        if self.max_batch is not None:
            value = min(value, self.max_batch)
        return value

    def observe(self, depth: float, times: int = 1) -> int:
        """Feed one queue-depth sample (``times`` samples of the same depth: the ticks a
        late sampler missed, the depth held meanwhile); returns the estimate after it."""
        if not math.isfinite(depth) or depth < 0:
            raise ValueError(f"queue depth must be a finite number >= 0, got {depth!r}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times!r}")
        for _ in range(times):
            self._observe_one(float(depth))
        return self.estimate

    def _observe_one(self, depth: float) -> None:
        self._ewma = (
            depth if self._ewma is None else self.alpha * depth + (1 - self.alpha) * self._ewma
        )
        floored = self._clamp(self._round(self._ewma))
        if len(self._recent) == self.window:
            old = self._recent[0]
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._recent.append(floored)
        self._counts[floored] += 1
        self._samples += 1

    @property
    def estimate(self) -> int:
        """The mode of the recent floored values (``min_batch`` before any sample)."""
        if not self._recent:
            return self._clamp(1)
        best = max(self._counts.values())
        for value in reversed(self._recent):
            if self._counts[value] == best:
                return value
        raise AssertionError("unreachable: the window is not empty")

    def state(self) -> EstimatorState:
        return EstimatorState(ewma=self.ewma, estimate=self.estimate, samples=self._samples)

    def reset(self) -> None:
        self._ewma = None
        self._recent.clear()
        self._counts.clear()
        self._samples = 0


def estimate_series(
    depths: list[float] | tuple[float, ...],
    *,
    alpha: float = DEFAULT_ALPHA,
    window: int = DEFAULT_WINDOW,
    rounding: str = "floor",
) -> list[int]:
    """The estimate after each sample of ``depths`` (for tests, simulations and plots)."""
    estimator = BatchSizeEstimator(alpha=alpha, window=window, rounding=rounding)
    return [estimator.observe(d) for d in depths]
