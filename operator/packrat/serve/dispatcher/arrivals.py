"""The arrivals a serving pod sees, for the operator's tuner (``GET /arrivals``).

Every prediction request the dispatcher admits, its body received whole, is stamped (not
the ones it refuses or sheds: see ``handle_predict``), with the wall clock (seconds since
the epoch, so the operator can merge the pods' logs) in a ring of at most ``capacity``
timestamps: memory is bounded whatever the load, and the oldest are dropped first. The
operator asks for what came after the last timestamp it saw (``?after=``) and gets at most
``limit`` of them, compactly: a base time and integer millisecond offsets from it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

DEFAULT_CAPACITY = 65_536
DEFAULT_LIMIT = 50_000
RESOLUTION_S = 1e-6


class ArrivalLog:
    """A bounded, append-only log of arrival timestamps (non-decreasing by construction)."""

    def __init__(
        self, *, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._times: deque[float] = deque(maxlen=capacity)
        self._clock = clock
        self.total = 0

    def record(self, n: int = 1) -> None:
        """``n`` arrivals now (a v2 request's samples: ``n`` requests to the tuner)."""
        now = self._clock()
        if self._times and now < self._times[-1]:
            now = self._times[-1]  # a wall clock stepped back: keep the log sorted
        self._times.extend([now] * n)
        self.total += n

    def __len__(self) -> int:
        return len(self._times)

    def after(self, after_s: float, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """Arrivals more than ``RESOLUTION_S`` after ``after_s``, the oldest ``limit`` of them
        (timestamps travel with microsecond resolution, so a cursor the caller took from an
        answer matches the arrival it came from).

        ``{"now", "base", "offsets_ms", "more", "total"}``: each arrival is ``base +
        offsets_ms[i] / 1000``; ``more`` says that newer ones were left for the next call."""
        times = list(self._times)  # one snapshot (the event loop is single-threaded)
        start = bisect.bisect_right(times, after_s + RESOLUTION_S)
        chosen = times[start : start + max(0, limit)]
        base = math.floor(chosen[0]) if chosen else 0.0
        return {
            "now": self._clock(),
            "base": base,
            "offsets_ms": [round((t - base) * 1000.0, 3) for t in chosen],
            "more": start + len(chosen) < len(times),
            "total": self.total,
        }
