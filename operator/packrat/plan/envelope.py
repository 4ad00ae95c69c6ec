"""Traffic envelopes and InferLine's tuner: scale replicas from the live arrivals.

An envelope is, for each window length ``w`` (from twice the service time, doubling, up to
60 s), the largest number of arrivals seen in any window of that length, as a rate
``r_w = max_count_w / w``. Short windows catch bursts, long windows catch rate shifts.

The tuner compares the live envelope with the one the plan was built for: the plan's ``n``
replicas were simulated to meet the SLO on the sample trace, so at window ``w`` they are
known to sustain its rate ``C_w`` (without a sample: ``n * mu``, ``mu`` being one replica's
throughput at the planned batch and size, InferLine's ``ceil(r / mu)`` rule). A live rate
``r_w`` asks for ``ceil(n * r_w / ((1 + tolerance) * C_w))`` replicas, so the plan's own
utilisation is kept and noise within the tolerance does nothing. The tuner scales up to the
largest count any window asks for at once, and scales down only to the largest count that
``ceil(n * r_w / C_w)`` (the tolerance kept as headroom: hysteresis) asked for over a
trailing ``scale_down_delay_s``, so a burst that recurs within that time never makes it flap.
``noise_z`` adds a counting-noise margin: a window the plan expects ``k`` arrivals in may see
``z sqrt(k)`` more before they count as load (at low rates short windows hold a handful of
arrivals, and their maxima over a minute vary by more than any tolerance).

**Start-up time.** A replica the tuner asks for serves only ``startup_s`` later (seconds when
a node has room, minutes when one must be added), and until then the replicas already
serving take whatever the load does. So the tuner keeps headroom for that time: the load may
grow within ``startup_s`` by the largest factor the plan's sample shows over that horizon
(``growth``, :func:`growth_within`; a steady sample gives about 1, a sample with a 4x step
about 3-4), and the replicas must sustain the rate at the start-up window times that factor,
on the way up (scale-ups anticipate the growth) and on the way down (no scale-down below
it), up to the planned count (the sample's growth ends at its peak, which the plan
sustains). A step larger than any the sample shows is caught as before, one start-up later.

Pure: the caller feeds arrival timestamps (seconds, any monotonic clock) and asks for a
decision at a time it chooses; memory is bounded by the longest window and ``max_events``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_WINDOW_S = 60.0


def window_sizes(
    service_time_s: float, *, max_window_s: float = MAX_WINDOW_S, min_window_s: float = 0.0
) -> list[float]:
    """Windows ``2s, 4s, 8s, ...`` below ``max_window_s``, then ``max_window_s`` itself;
    the first is at least ``min_window_s`` (below the timestamps' jitter a window counts
    the jitter, not the load)."""
    if not (math.isfinite(service_time_s) and service_time_s > 0):
        raise ValueError(f"service time must be > 0, got {service_time_s!r}")
    if max_window_s <= 0:
        raise ValueError("max_window_s must be > 0")
    sizes = []
    w = max(2.0 * service_time_s, min_window_s)
    while w < max_window_s:
        sizes.append(w)
        w *= 2.0
    sizes.append(max_window_s)
    return sizes


def growth_within(
    times_s: np.ndarray | Sequence[float],
    horizon_s: float,
    *,
    noise_z: float = 2.0,
    max_points: int = 10_000,
    min_count: int = 10,
) -> float:
    """The largest factor by which the arrival rate rose within ``horizon_s`` in a trace.

    Windows of ``w = max(horizon_s, 1 s)`` are compared with the window ending ``horizon_s``
    later, stepping by ``w / 4`` (at most ``max_points`` comparisons: bounded work on any
    trace); a count ``c`` is taken as ``c - z sqrt(c)`` in the later window and ``c + z
    sqrt(c)`` in the earlier one, so Poisson counting noise alone reads as about 1; an
    earlier window with fewer than ``min_count`` arrivals is skipped (from a handful of
    arrivals any later count is a large ratio, and noise). At least 1; 1 for a trace
    shorter than ``w + horizon_s``."""
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon must be > 0 s, got {horizon_s!r}")
    t = np.asarray(times_s, dtype=np.float64)
    if t.size < 2:
        return 1.0
    w = max(horizon_s, 1.0)
    span = float(t[-1] - t[0])
    if span < w + horizon_s:
        return 1.0
    step = max(w / 4.0, (span - w - horizon_s) / max_points)
    ends = t[0] + w + np.arange(0.0, span - w - horizon_s + 1e-9, step)
    before = np.searchsorted(t, ends) - np.searchsorted(t, ends - w)
    after = np.searchsorted(t, ends + horizon_s) - np.searchsorted(t, ends + horizon_s - w)
    counted = before >= min_count  # a handful of arrivals is no rate to grow from
    if not counted.any():
        return 1.0
    lo = before[counted] + noise_z * np.sqrt(before[counted])
    hi = after[counted] - noise_z * np.sqrt(after[counted])
    return float(max(1.0, float((hi / lo).max())))


GROWTH_HORIZONS_S = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Horizons a plan records its sample's growth at (:func:`growth_curve`)."""


def growth_curve(
    times_s: np.ndarray | Sequence[float], horizons: Sequence[float] = GROWTH_HORIZONS_S
) -> tuple[tuple[float, float], ...]:
    """``(horizon, growth_within(horizon, noise_z=1))`` for each horizon: what a tuner needs
    to keep start-up headroom for any start-up time, without the trace."""
    return tuple((h, growth_within(times_s, h, noise_z=1.0)) for h in horizons)


def growth_at(curve: Sequence[tuple[float, float]], horizon_s: float) -> float:
    """How much the load may grow within ``horizon_s``: the largest growth recorded at any
    horizon up to the first one at least ``horizon_s`` (what may happen within a shorter
    time may happen within a longer one; a sample shorter than a long horizon records no
    growth there, yet its short steps still count). 1 for an empty curve."""
    best = 1.0
    for h, g in curve:
        best = max(best, g)
        if h >= horizon_s:
            break
    return best


def envelope(times_s: np.ndarray | Sequence[float], windows: Sequence[float]) -> np.ndarray:
    """The largest arrival count in any window of each length, as a rate (per second).

    A window longer than the span observed is counted over what was seen, but divided by its
    full length, so a short history never inflates a long window's rate.
    """
    t = np.asarray(times_s, dtype=np.float64)
    out = np.zeros(len(windows))
    if t.size == 0:
        return out
    idx = np.arange(t.size)
    for i, w in enumerate(windows):
        ends = np.searchsorted(t, t + w, side="left")
        out[i] = (ends - idx).max() / w
    return out


@dataclass(frozen=True, slots=True)
class Decision:
    """What the tuner wants now, and why (for status, events and metrics)."""

    time_s: float
    replicas: int
    previous: int
    wanted_now: int
    reason: str
    rates: tuple[float, ...] = field(default=())

    @property
    def action(self) -> str:
        if self.replicas > self.previous:
            return "scale_up"
        if self.replicas < self.previous:
            return "scale_down"
        return "hold"

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "action": self.action,
            "replicas": self.replicas,
            "previous": self.previous,
            "wanted_now": self.wanted_now,
            "reason": self.reason,
        }


class Tuner:
    """InferLine's high-frequency tuner for one model (see the module docstring)."""

    def __init__(
        self,
        *,
        planned_replicas: int,
        replica_capacity: float,
        windows: Sequence[float],
        planned_rates: Sequence[float] | None = None,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        scale_down_delay_s: float = 120.0,
        tolerance: float = 0.1,
        noise_z: float = 0.0,
        max_events: int = 1_000_000,
        startup_s: float = 0.0,
        growth: float = 1.0,
    ) -> None:
        if planned_replicas < 1 or min_replicas < 1:
            raise ValueError("replica counts must be >= 1")
        if max_replicas is not None and max_replicas < min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        if not (math.isfinite(replica_capacity) and replica_capacity > 0):
            raise ValueError(f"replica capacity must be > 0, got {replica_capacity!r}")
        if not windows or any(w <= 0 for w in windows):
            raise ValueError("windows must be positive")
        if planned_rates is not None and len(planned_rates) != len(windows):
            raise ValueError("planned_rates must have one rate per window")
        self.windows = list(windows)
        self.planned = planned_replicas
        self.mu = replica_capacity
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        base = planned_replicas * replica_capacity
        planned = planned_rates if planned_rates is not None else [0.0] * len(windows)
        self._planned_sustained = [r if r > 0 else base for r in planned]
        self.tolerance = tolerance
        if noise_z < 0:
            raise ValueError("noise_z must be >= 0")
        self.noise_z = noise_z
        self.sustained: list[float] = []
        self.margin: list[float] = []
        self.set_capacity(replica_capacity)
        self.startup_s = 0.0
        self.growth = 1.0
        self._startup_window = 0
        self.set_startup(startup_s, growth)
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.scale_down_delay_s = scale_down_delay_s
        self.horizon_s = max(self.windows)
        self._arrivals: deque[float] = deque(maxlen=max_events)
        self._wanted: deque[tuple[float, int]] = deque()
        self.replicas = self._clamp(planned_replicas)
        self._started: float | None = None

    def _clamp(self, n: int) -> int:
        n = max(n, self.min_replicas)
        return min(n, self.max_replicas) if self.max_replicas is not None else n

    def observe(self, times_s: Iterable[float]) -> None:
        """Record arrivals; ones older than the newest recorded (a pod read late) are merged
        in order, so a late reading still counts."""
        arrivals = self._arrivals
        late: list[float] = []
        for t in times_s:
            if not arrivals or t >= arrivals[-1]:
                arrivals.append(t)
            else:
                late.append(t)
        if late:
            merged = sorted([*arrivals, *late])
            self._arrivals = deque(merged, maxlen=arrivals.maxlen)

    def rates(self, now_s: float) -> np.ndarray:
        """The live envelope over the last ``horizon_s`` (the longest window)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0] < now_s - self.horizon_s:
            arrivals.popleft()
        return envelope(np.fromiter(arrivals, dtype=np.float64), self.windows)

    def decide(self, now_s: float) -> Decision:
        if self._started is None:
            self._started = now_s
        rates = self.rates(now_s)
        wants = [
            math.ceil(self.planned * r / ((1 + self.tolerance) * c + e) - 1e-9) if r > 0 else 0
            for r, c, e in zip(rates.tolist(), self.sustained, self.margin, strict=True)
        ]
        worst = int(np.argmax([w / self.planned for w in wants]))
        watched = now_s - self._started
        ahead = self._startup_headroom(rates, 1.0, watched)
        wanted = self._clamp(max(*wants, ahead, self.min_replicas))
        # hysteresis: the way down keeps the tolerance as headroom (no tolerance applied)
        keep = max(
            (
                math.ceil(self.planned * r / (c + e) - 1e-9)
                for r, c, e in zip(rates, self.sustained, self.margin, strict=True)
            ),
            default=0,
        )
        keep = max(keep, self._startup_headroom(rates, 1.0, watched))
        history = self._wanted
        history.append((now_s, self._clamp(max(keep, wanted, self.min_replicas))))
        while history and history[0][0] < now_s - self.scale_down_delay_s:
            history.popleft()
        previous = self.replicas
        w = self.windows[worst]
        detail = (
            f"window {w:g} s at {rates[worst]:.1f}/s vs {self.sustained[worst]:.1f}/s "
            f"sustained by {self.planned} planned replicas"
        )
        if wanted > previous:
            self.replicas = wanted
            reason = f"scale up to {wanted}: {detail}"
        else:
            trailing = max(n for _, n in history)
            if trailing < previous and self._covers_delay(now_s):
                self.replicas = trailing
                reason = (
                    f"scale down to {trailing}: no more wanted for {self.scale_down_delay_s:g} s "
                    f"({detail})"
                )
            else:
                reason = f"hold {previous}: {detail}"
        return Decision(
            time_s=now_s,
            replicas=self.replicas,
            previous=previous,
            wanted_now=wanted,
            reason=reason,
            rates=tuple(rates.tolist()),
        )

    def set_capacity(self, replica_capacity: float) -> None:
        """What one replica serves now (its plan changed: autoBatch): the rates the planned
        replicas sustain scale with it, keeping the plan's utilisation."""
        if not (math.isfinite(replica_capacity) and replica_capacity > 0):
            raise ValueError(f"replica capacity must be > 0, got {replica_capacity!r}")
        scale = replica_capacity / self.mu
        self.sustained = [r * scale for r in self._planned_sustained]
        # counting noise: a window the plan expects k arrivals in is allowed z * sqrt(k) more
        # before it counts as more load (short windows hold a few arrivals; one more is noise)
        self.margin = [
            self.noise_z * math.sqrt(c * w) / w
            for c, w in zip(self.sustained, self.windows, strict=True)
        ]

    def set_startup(self, startup_s: float, growth: float) -> None:
        """Change the start-up time and the growth within it (measured again from the pods)
        without losing the arrivals seen."""
        if not (math.isfinite(startup_s) and startup_s >= 0):
            raise ValueError(f"startup_s must be >= 0, got {startup_s!r}")
        if not (math.isfinite(growth) and growth >= 1):
            raise ValueError(f"growth must be >= 1, got {growth!r}")
        self.startup_s = startup_s
        self.growth = growth
        # the window the headroom is measured at: the first at least as long as a start-up
        self._startup_window = next(
            (i for i, w in enumerate(self.windows) if w >= startup_s), len(self.windows) - 1
        )

    def _startup_headroom(self, rates: np.ndarray, tolerance: float, watched_s: float) -> int:
        """Replicas for the rate at the start-up window grown by ``growth`` (0 without a
        start-up time, or when the sample shows no growth), at most the planned count: the
        sample's growth ends at the sample's peak, which the plan sustains (a load beyond it
        is the envelope's to catch). The rate is read at the first window as long as a
        start-up or, until the tuner has watched that long, the longest window it has
        watched (a longer one would read the missing history as no load)."""
        if self.startup_s <= 0 or self.growth <= 1.0:
            return 0
        i = self._startup_window
        while i > 0 and self.windows[i] > watched_s:
            i -= 1
        r = float(rates[i]) * self.growth
        if r <= 0:
            return 0
        want = math.ceil(self.planned * r / (tolerance * self.sustained[i] + self.margin[i]) - 1e-9)
        return min(want, self.planned)

    def _covers_delay(self, now_s: float) -> bool:
        """Scale down only once the tuner has watched for the whole delay."""
        return self._started is not None and self._started <= now_s - self.scale_down_delay_s


def replay(
    tuner: Tuner, times_s: np.ndarray, *, interval_s: float = 1.0, until_s: float | None = None
) -> list[Decision]:
    """Feed a trace to ``tuner`` and decide every ``interval_s`` (for tests and simulations)."""
    end = float(times_s[-1]) if until_s is None and times_s.size else (until_s or 0.0)
    decisions = []
    lo = 0
    now = interval_s
    while now <= end + interval_s:
        hi = int(np.searchsorted(times_s, now, side="right"))
        tuner.observe(times_s[lo:hi].tolist())
        lo = hi
        decisions.append(tuner.decide(now))
        now += interval_s
    return decisions


def schedule(decisions: Sequence[Decision], *, initial: int) -> list[tuple[float, int]]:
    """``(time_s, replicas)`` steps from decisions: when the replica count changed."""
    steps = [(0.0, initial)]
    for d in decisions:
        if d.replicas != steps[-1][1]:
            steps.append((d.time_s, d.replicas))
    return steps
