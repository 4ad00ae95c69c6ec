"""Which instance gets the next request: least outstanding work relative to batch size.

A plan's instances serve different slices of the batch (e.g. b=8 and b=4), so a request
goes to the instance whose queue, measured in its own batches, is shortest: argmin of
``(outstanding_i + 1) / b_i`` over instances that are up and below their cap. For a burst
of B = sum b_i requests this fills every instance with exactly its b_i, which is what the
plan's latency assumes. Pure; the dispatcher keeps the counters.
"""

from __future__ import annotations

from collections.abc import Sequence


def default_caps(batches: Sequence[int], *, factor: int = 2) -> list[int]:
    """Outstanding requests allowed per instance before the dispatcher queues: one batch
    running and one forming (``factor`` batches)."""
    return [max(1, factor * b) for b in batches]


def choose_instance(
    outstanding: Sequence[int],
    batches: Sequence[int],
    *,
    up: Sequence[bool] | None = None,
    caps: Sequence[int] | None = None,
) -> int | None:
    """The index of the instance to send the next request to, or None when none can take it.

    Ties go to the larger batch, then the lower index (deterministic).
    """
    if len(outstanding) != len(batches):
        raise ValueError("outstanding and batches differ in length")
    best: int | None = None
    best_key: tuple[float, int, int] | None = None
    for i, (n, b) in enumerate(zip(outstanding, batches, strict=True)):
        if up is not None and not up[i]:
            continue
        if caps is not None and n >= caps[i]:
            continue
        key = ((n + 1) / b, -b, i)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best
