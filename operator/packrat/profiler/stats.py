"""Small, dependency-free statistics for latency samples (no torch, no numpy).

The profiler's stopping rule ("repeat until the 95% confidence interval of the mean is within
2% of it") and the benchmark's summaries (median and spread) live here as pure functions so
they can be tested exactly and used by the worker process before torch is imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Summary", "ci_halfwidth", "quantile", "summarize", "t_critical"]

_Z975 = 1.959963984540054
# Two-sided 95% Student t critical values for df = 1..10; above that a Cornish-Fisher series
# is accurate to better than 1e-3.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_critical(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def stdev(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for a single value."""
    n = len(values)
    if n < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))


def ci_halfwidth(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean; inf for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return math.inf
    return t_critical(n - 1) * stdev(values) / math.sqrt(n)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Summary:
    """Descriptive statistics of one set of latency samples (ms)."""

    n: int
    mean: float
    stdev: float
    cv: float
    ci95: float  # half-width of the 95% CI of the mean, ms (inf when n < 2)
    min: float
    p25: float
    p50: float
    p75: float
    p99: float
    max: float

    @property
    def rel_ci(self) -> float:
        """CI half-width relative to the mean (the profiler's precision criterion)."""
        return self.ci95 / self.mean if self.mean > 0 else math.inf

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("summary of no values")
    m = mean(values)
    sd = stdev(values)
    return Summary(
        n=len(values),
        mean=m,
        stdev=sd,
        cv=sd / m if m > 0 else 0.0,
        ci95=ci_halfwidth(values),
        min=min(values),
        p25=quantile(values, 0.25),
        p50=quantile(values, 0.5),
        p75=quantile(values, 0.75),
        p99=quantile(values, 0.99),
        max=max(values),
    )


def precise_enough(values: Sequence[float], *, precision: float, min_samples: int) -> bool:
    """The stopping rule: enough samples and a 95% CI of the mean within ``precision``."""
    if len(values) < max(2, min_samples):
        return False
    m = mean(values)
    return m > 0 and ci_halfwidth(values) <= precision * m
