"""The operator's one exponential backoff, with jitter.

Used wherever something is tried again after a failure: a pass that raised (an API error,
:func:`packrat.controller.core.wakeups.run_passes`), a profiling Job that failed, a store that
could not be asked for a model's version. The delay doubles per attempt up to a cap, less a
jitter of up to ``SPREAD`` of itself, so models that failed together (an API server restart,
a store outage) do not all come back in the same second.

The jitter is drawn from a seed (the object's key) and the attempt, not from a random source:
the same attempt of the same object always waits the same (a delay recomputed by each pass
from the status, as the store check's is, stays put, and tests are repeatable), while
different objects spread apart.
"""

from __future__ import annotations

import hashlib

SPREAD = 0.2
"""The largest share of a delay the jitter takes off (the delay stays within [0.8, 1] x)."""


def jitter(seed: str, attempt: int) -> float:
    """A fraction in [0, 1) drawn from ``seed`` and ``attempt`` (stable, spread evenly)."""
    digest = hashlib.sha256(f"{seed}#{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def backoff(attempt: int, *, base: float, cap: float, seed: str = "") -> float:
    """Seconds before try ``attempt`` + 1 after ``attempt`` failures in a row (1: the first):
    ``base`` doubled per failure up to ``cap``, less up to :data:`SPREAD` of it by the jitter
    of ``seed`` (never more than ``cap``; never less than ``(1 - SPREAD)`` of the plain
    delay)."""
    delay = min(base * 2.0 ** (max(attempt, 1) - 1), cap)
    return delay * (1.0 - SPREAD * jitter(seed, attempt))
