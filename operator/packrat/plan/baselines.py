"""The two baselines every Packrat plan is measured against, defined once.

- ``fat``: one instance with all T threads running the whole batch B, what a CPU inference
  server runs by default;
- ``per_core``: one 1-thread instance per core (``min(T, B)`` of them), the batch split as
  evenly as it goes, the other obvious hand-made configuration.

Both benchmarks (``packrat bench`` on raw workers, ``packrat bench --serving`` through the
serving stack) build their baselines here, from a profile table, so they compare the same
configurations under the same names. Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from packrat.plan.optimizer import InstanceGroup, Plan

FAT = "fat"
PER_CORE = "per_core"
BASELINES = (FAT, PER_CORE)

Table = Mapping[tuple[int, int], float]


def even_split(batch: int, parts: int) -> list[int]:
    """``batch`` split into at most ``parts`` near-equal positive pieces, largest first."""
    parts = max(1, min(parts, batch))
    base, rest = divmod(batch, parts)
    return [base + 1 if i < rest else base for i in range(parts)]


def baseline_pairs(name: str, *, cpus: int, batch: int) -> tuple[tuple[int, int], ...]:
    """The instances ``(threads, batch)`` of baseline ``name`` for T cores and batch B."""
    if name == FAT:
        return ((cpus, batch),)
    if name == PER_CORE:
        return tuple((1, b) for b in even_split(batch, cpus))
    raise ValueError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")


def expected_latency(pairs: tuple[tuple[int, int], ...], table: Table) -> float | None:
    """The slowest instance's profiled latency, or None when a pair was not profiled."""
    values = [table.get(pair) for pair in pairs]
    if any(v is None for v in values):
        return None
    return max(v for v in values if v is not None)


def baseline_plan(name: str, *, cpus: int, batch: int, table: Table) -> Plan:
    """Baseline ``name`` as a :class:`Plan` (so it can be served like any plan).

    Its ``expected_latency_ms`` is the profile's; where an instance was not profiled it falls
    back to the fat latency (:func:`expected_latency` says whether the profile covers it).
    """
    pairs = baseline_pairs(name, cpus=cpus, batch=batch)
    counts: dict[tuple[int, int], int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    groups = tuple(
        InstanceGroup(t, b, n, table.get((t, b)))
        for (t, b), n in sorted(counts.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
    )
    fat = table.get((cpus, batch))
    expected = expected_latency(pairs, table) or fat or 1.0
    return Plan(
        cpus=cpus,
        batch=batch,
        instances=groups,
        expected_latency_ms=expected,
        fat_latency_ms=fat,
    )
