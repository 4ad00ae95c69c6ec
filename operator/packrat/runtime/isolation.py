"""Are this process's cores the ones requested, and are they quiet? Measured, not assumed.

A Guaranteed pod gets an exclusive cpuset only from the kubelet's static CPU manager; without
it (or beside a sidecar that takes a share), the cpuset covers the whole shared pool and
latencies degrade silently. Two checks, both cheap:

- the cpuset: exactly the requested number of cores (``exact``); a wider one means the cores
  are not exclusively ours (a laptop run on a subset of its cores is the benign case);
- quietness: a spare-CPU calibration. A spin loop pinned to each core in turn for a short
  while gets the whole core when nothing else runs there, and about half of it beside one
  busy process (the scheduler shares a core fairly). ``share`` is its thread CPU time over
  wall time; a core below :data:`QUIET_SHARE` is busy.

Also recorded, for the report (not decisive, since they are not per core): the CPU pressure
of the system and of this cgroup (``some avg10``, PSI), the run queue (``procs_running``) and
CFS throttling of this cgroup (``nr_throttled``; a CPU quota below the threads in use).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrat.runtime.cpus import allowed_cpus, format_cpu_list

__all__ = [
    "QUIET_SHARE",
    "IsolationReport",
    "calibrate_core",
    "check_isolation",
    "merge_reports",
    "read_pressure",
]

QUIET_SHARE = 0.85  # spare share below this: something else runs on the core
CALIBRATION_S = 0.2  # per core


def read_pressure(path: str | Path = "/proc/pressure/cpu") -> float | None:
    """``some avg10`` (percent of the last 10 s some task waited for a CPU), or None."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def _procs_running(path: str | Path = "/proc/stat") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_dir() -> Path | None:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            path = Path("/sys/fs/cgroup") / line[3:].strip().lstrip("/")
            return path if path.is_dir() else None
    return None


def _throttled() -> int | None:
    base = _cgroup_dir()
    if base is None:
        return None
    try:
        for line in (base / "cpu.stat").read_text().splitlines():
            if line.startswith("nr_throttled "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def calibrate_core(cpu: int, *, seconds: float = CALIBRATION_S) -> float:
    """The share of ``cpu`` a pinned spin loop gets for ``seconds`` (1.0 = the whole core).

    Pins the calling thread only (``sched_setaffinity(0)`` is per thread on Linux) and
    restores its affinity afterwards.
    """
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        time.sleep(0)  # let the migration happen before the clock starts
        wall0, cpu0 = time.monotonic(), time.thread_time()
        deadline = wall0 + seconds
        while time.monotonic() < deadline:
            pass
        wall, used = time.monotonic() - wall0, time.thread_time() - cpu0
    finally:
        os.sched_setaffinity(0, before)
    return min(1.0, used / wall) if wall > 0 else 0.0


@dataclass(slots=True)
class IsolationReport:
    """What the checks found; ``to_dict`` is what a profile or a pod status records."""

    requested: int
    cpuset: list[int]
    share: dict[int, float] = field(default_factory=dict)  # per core, the lowest seen
    pressure_some_avg10: float | None = None  # system-wide PSI, percent
    cgroup_pressure_some_avg10: float | None = None  # this cgroup's PSI, percent
    procs_running: int | None = None
    throttled: int | None = None  # nr_throttled increase while checking (or profiling)
    checks: int = 1

    @property
    def exact(self) -> bool:
        return len(self.cpuset) == self.requested

    @property
    def busy_cores(self) -> list[int]:
        return sorted(c for c, s in self.share.items() if s < QUIET_SHARE)

    @property
    def quiet(self) -> bool:
        return not self.busy_cores and not self.throttled

    @property
    def exclusive(self) -> bool:
        return self.exact and self.quiet

    def reasons(self) -> list[str]:
        out = []
        if not self.exact:
            out.append(
                f"cpuset {format_cpu_list(self.cpuset)} has {len(self.cpuset)} cpu(s), "
                f"{self.requested} requested (no static CPU manager, or shared cores)"
            )
        busy = self.busy_cores
        if busy:
            shares = ", ".join(f"cpu {c}: {self.share[c]:.2f}" for c in busy)
            out.append(
                f"busy core(s): a pinned spin loop got only {shares} of the core "
                f"(quiet >= {QUIET_SHARE})"
            )
        if self.throttled:
            out.append(f"CFS throttled {self.throttled} time(s): the CPU quota is too small")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "cpuset": format_cpu_list(self.cpuset),
            "exact": self.exact,
            "quiet": self.quiet,
            "exclusive": self.exclusive,
            "spare_share": {str(c): round(s, 3) for c, s in sorted(self.share.items())},
            "busy_cores": self.busy_cores,
            "pressure_some_avg10": self.pressure_some_avg10,
            "cgroup_pressure_some_avg10": self.cgroup_pressure_some_avg10,
            "procs_running": self.procs_running,
            "throttled": self.throttled,
            "checks": self.checks,
            "reasons": self.reasons(),
        }


def check_isolation(
    requested: int,
    *,
    cpus: Sequence[int] | None = None,
    calibrate: Iterable[int] | None = None,
    seconds: float = CALIBRATION_S,
) -> IsolationReport:
    """Check this process's cpuset against ``requested`` cores and calibrate each core.

    ``calibrate`` limits the calibration to some cores (default: the first ``requested`` of
    the cpuset, the ones a profile or a pod's instances use).
    """
    cpuset = sorted(cpus) if cpus is not None else allowed_cpus()
    targets = list(calibrate) if calibrate is not None else cpuset[:requested]
    throttled0 = _throttled()
    share = {cpu: calibrate_core(cpu, seconds=seconds) for cpu in targets}
    throttled1 = _throttled()
    cgroup = _cgroup_dir()
    return IsolationReport(
        requested=requested,
        cpuset=cpuset,
        share=share,
        pressure_some_avg10=read_pressure(),
        cgroup_pressure_some_avg10=(
            read_pressure(cgroup / "cpu.pressure") if cgroup is not None else None
        ),
        procs_running=_procs_running(),
        throttled=(
            throttled1 - throttled0 if throttled0 is not None and throttled1 is not None else None
        ),
    )


def _sum_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def merge_reports(reports: Sequence[IsolationReport]) -> IsolationReport:
    """One report over several checks: the lowest share per core, the worst pressure."""
    if not reports:
        raise ValueError("no reports to merge")
    first = reports[0]
    share: dict[int, float] = {}
    for report in reports:
        for cpu, value in report.share.items():
            share[cpu] = min(value, share.get(cpu, 1.0))

    def worst(values: Iterable[float | int | None]) -> Any:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return IsolationReport(
        requested=first.requested,
        cpuset=first.cpuset,
        share=share,
        pressure_some_avg10=worst(r.pressure_some_avg10 for r in reports),
        cgroup_pressure_some_avg10=worst(r.cgroup_pressure_some_avg10 for r in reports),
        procs_running=worst(r.procs_running for r in reports),
        throttled=_sum_known(r.throttled for r in reports),
        checks=sum(r.checks for r in reports),
    )
