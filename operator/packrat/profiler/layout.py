"""Where the instances that measure one profile point (t, b) run: pure, no processes.

``co-located`` (the default): floor(T/t) identical t-thread instances on disjoint cores of
the profiled cpuset, all timed, so that L(t, b) is what an instance sees inside a plan that
fills the node: neighbours sharing the last-level cache, the memory bandwidth and the
package's all-core clock. The remainder, r = T mod t cores, is not left idle: an untimed
*filler* instance of r threads runs the same batch there, so every timed instance has busy
neighbours on all T cores, as in a plan that uses the whole node (the optimizer's plans
leave cores idle only when that is faster, and the profile then errs on the slow side, the
safe one for a latency promise). ``alone``: one instance on t cores, the others idle (the
paper's way, and Packrat's before co-location).

Core sets come from :func:`packrat.runtime.cpus.assign_cores`: an instance never spans two
sockets unless it is wider than one, and instances get distinct physical cores before SMT
siblings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packrat.plan.profile import ALONE, COLOCATED, MODES
from packrat.runtime.cpus import CpuInfo, assign_cores

__all__ = ["PointLayout", "point_layout"]


@dataclass(frozen=True, slots=True)
class PointLayout:
    """The instances of one point: the timed ones' core sets and the filler's (maybe none)."""

    threads: int
    timed: tuple[tuple[int, ...], ...]
    filler: tuple[int, ...] = ()

    @property
    def instances(self) -> int:
        return len(self.timed)

    @property
    def busy(self) -> tuple[int, ...]:
        return tuple(sorted({c for cores in self.timed for c in cores} | set(self.filler)))


def point_layout(
    threads: int,
    cpus: Sequence[int],
    *,
    mode: str = COLOCATED,
    fill_remainder: bool = True,
    topology: Sequence[CpuInfo] | None = None,
) -> PointLayout:
    """The layout of a ``threads``-thread point on ``cpus`` (the profiled cpuset, T cores)."""
    if mode not in MODES:
        raise ValueError(f"unknown profiling mode {mode!r} (known: {', '.join(MODES)})")
    total = len(set(cpus))
    if not 1 <= threads <= total:
        raise ValueError(f"threads must be in 1..{total}, got {threads}")
    if mode == ALONE:
        (cores,) = assign_cores([threads], cpus=cpus, topology=topology, span_sockets=True)
        return PointLayout(threads, (tuple(cores),))
    count, rest = divmod(total, threads)
    sizes = [threads] * count + ([rest] if rest and fill_remainder else [])
    sets = assign_cores(sizes, cpus=cpus, topology=topology, span_sockets=True)
    timed = tuple(tuple(s) for s in sets[:count])
    filler = tuple(sets[count]) if len(sets) > count else ()
    return PointLayout(threads, timed, filler)
