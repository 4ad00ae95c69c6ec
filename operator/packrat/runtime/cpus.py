"""The cores this process may use, their topology, and how to split them between instances.

A pod with integer CPUs under the static CPU manager gets an exclusive cpuset that need not
start at core 0, and ``os.cpu_count()`` reports the whole node. Everything that pins a model
instance therefore starts from :func:`allowed_cpus` (the cgroup's effective cpuset intersected
with the scheduler affinity) and splits it with :func:`assign_cores`: disjoint sets, never
across a socket, physical cores before their SMT siblings. No torch import here, so the
controller-facing tools and tests stay light.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CoreAssignmentError",
    "CpuInfo",
    "allowed_cpus",
    "assign_cores",
    "cgroup_cpus",
    "cpu_model",
    "format_cpu_list",
    "parse_cpu_list",
    "read_topology",
]


class CoreAssignmentError(ValueError):
    """The requested instances do not fit the given cores (or the request is invalid)."""


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """One logical CPU: its id, its physical core id (unique within a socket), its socket."""

    cpu: int
    core: int
    socket: int


# -- cpu list syntax ("0-3,8") ---------------------------------------------------------------
def parse_cpu_list(text: str) -> list[int]:
    """Parse the kernel's cpu list syntax: ``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (sorted, unique).

    Also accepts strides (``"0-7:2"``), surrounding whitespace and the empty string (no cpus).
    """
    cpus: set[int] = set()
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, _, stride_text = part.partition(":")
            stride = _parse_int(stride_text, text)
            if stride < 1:
                raise ValueError(f"invalid cpu list {text!r}: stride must be >= 1")
        if "-" in part:
            lo_text, _, hi_text = part.partition("-")
            lo, hi = _parse_int(lo_text, text), _parse_int(hi_text, text)
            if hi < lo:
                raise ValueError(f"invalid cpu list {text!r}: range {part!r} is reversed")
            cpus.update(range(lo, hi + 1, stride))
        else:
            cpus.add(_parse_int(part, text))
    return sorted(cpus)


def _parse_int(value: str, text: str) -> int:
    value = value.strip()
    if not value.isdigit():
        raise ValueError(f"invalid cpu list {text!r}: {value!r} is not a cpu number")
    return int(value)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpu_list`: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# -- cgroups ---------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _own_cgroups(root: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and cgroup v1 cpuset path, from /proc/self/cgroup."""
    text = _read(root / "proc/self/cgroup") or ""
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpuset" in controllers.split(","):
            v1 = path
    return v2, v1


def _walk_up(base: Path, cgroup_path: str, names: Sequence[str]) -> str | None:
    """The first non-empty file ``names`` in the cgroup directory or its nearest ancestor.

    Walking up covers containers without a cgroup namespace, where /proc/self/cgroup shows a
    host path that is not mounted inside, and cgroups that do not enable the controller.
    """
    parts = [p for p in cgroup_path.strip("/").split("/") if p]
    for depth in range(len(parts), -1, -1):
        directory = base.joinpath(*parts[:depth]) if depth else base
        for name in names:
            value = _read(directory / name)
            if value:
                return value
    return None


def cgroup_cpus(*, root: str | Path = "/") -> list[int] | None:
    """The cpuset of this process's cgroup (v2 ``cpuset.cpus.effective``, v1 fallback).

    ``root`` is the filesystem root to read ``proc/`` and ``sys/`` under (tests use a tmp
    dir). Returns None when no cgroup cpuset can be read.
    """
    base = Path(root)
    v2, v1 = _own_cgroups(base)
    if v2 is not None:
        for mount in ("sys/fs/cgroup", "sys/fs/cgroup/unified"):
            value = _walk_up(base / mount, v2, ("cpuset.cpus.effective",))
            if value:
                return parse_cpu_list(value)
    if v1 is not None:
        value = _walk_up(
            base / "sys/fs/cgroup/cpuset", v1, ("cpuset.effective_cpus", "cpuset.cpus")
        )
        if value:
            return parse_cpu_list(value)
    return None


def allowed_cpus(*, root: str | Path = "/", affinity: Iterable[int] | None = None) -> list[int]:
    """The cpus this process may run on: its cgroup cpuset intersected with its affinity.

    ``affinity`` defaults to ``os.sched_getaffinity(0)``. If the cgroup cannot be read, or the
    intersection is empty (an inconsistent view), the affinity alone is returned.
    """
    own = sorted(set(os.sched_getaffinity(0) if affinity is None else affinity))
    cgroup = cgroup_cpus(root=root)
    if cgroup is None:
        return own
    both = sorted(set(own) & set(cgroup))
    return both or own


# -- topology --------------------------------------------------------------------------------
def _read_int(path: Path) -> int | None:
    value = _read(path)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def read_topology(cpus: Iterable[int] | None = None, *, root: str | Path = "/") -> list[CpuInfo]:
    """Core and socket of each cpu from sysfs (default: :func:`allowed_cpus`).

    Safe defaults when sysfs is missing: every cpu its own core, all on socket 0. A core id of
    -1 (some virtual machines) is also treated as "own core".
    """
    base = Path(root)
    ids = allowed_cpus(root=root) if cpus is None else sorted(set(cpus))
    out: list[CpuInfo] = []
    for cpu in ids:
        topo = base / f"sys/devices/system/cpu/cpu{cpu}/topology"
        core = _read_int(topo / "core_id")
        socket = _read_int(topo / "physical_package_id")
        if socket is None or socket < 0:
            socket = 0
        if core is None or core < 0:
            core = 1_000_000 + cpu  # unknown: its own physical core
        out.append(CpuInfo(cpu=cpu, core=core, socket=socket))
    return out


def cpu_model(*, root: str | Path = "/") -> str:
    """The CPU's model name (``/proc/cpuinfo``), e.g. ``Intel(R) Xeon(R) Processor``."""
    text = _read(Path(root) / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        names = ("model name", "Model Name", "cpu model", "Processor")
        if sep and key.strip() in names and value.strip():
            return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


# -- core assignment -------------------------------------------------------------------------
def _socket_order(infos: Sequence[CpuInfo]) -> list[int]:
    """Cpus of one socket: the first thread of every physical core, then the siblings."""
    by_core: dict[int, list[int]] = {}
    for info in infos:
        by_core.setdefault(info.core, []).append(info.cpu)
    siblings = [sorted(v) for _, v in sorted(by_core.items(), key=lambda kv: min(kv[1]))]
    depth = max((len(s) for s in siblings), default=0)
    return [s[level] for level in range(depth) for s in siblings if level < len(s)]


def _pack(sizes: Sequence[int], capacity: Sequence[int]) -> list[int] | None:
    """Socket index per item (items sorted largest first), or None; exact, with pruning."""
    # Best-fit decreasing answers almost every real case at once.
    free = list(capacity)
    choice: list[int] = []
    for size in sizes:
        fits = [s for s in range(len(free)) if free[s] >= size]
        if not fits:
            break
        best = min(fits, key=lambda s: (free[s], s))
        free[best] -= size
        choice.append(best)
    else:
        return choice
    # Exhaustive search (bin packing); sockets with equal free space are symmetric.
    budget = [200_000]
    free = list(capacity)
    choice = []

    def search(i: int) -> bool:
        if i == len(sizes):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return False
        tried: set[int] = set()
        for s in range(len(free)):
            if free[s] >= sizes[i] and free[s] not in tried:
                tried.add(free[s])
                free[s] -= sizes[i]
                choice.append(s)
                if search(i + 1):
                    return True
                choice.pop()
                free[s] += sizes[i]
        return False

    return choice if search(0) else None


def assign_cores(
    threads: Sequence[int],
    *,
    cpus: Sequence[int],
    topology: Sequence[CpuInfo] | None = None,
    span_sockets: bool = False,
) -> list[list[int]]:
    """Disjoint cpu sets, one per instance, ``len(result[i]) == threads[i]``.

    Rules: an instance never spans two sockets; within a socket, instances get distinct
    physical cores before any SMT sibling is used; sets are handed out in cpu order so an
    instance's cores are close together. Raises :class:`CoreAssignmentError` with the reason
    when the instances do not fit. With ``span_sockets=True`` (for an instance wider than a
    socket, e.g. the fat instance on a two-socket cpuset) instances that cannot be placed
    within sockets are laid out socket after socket instead of failing.
    """
    wanted = list(threads)
    for t in wanted:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise CoreAssignmentError(f"thread counts must be integers >= 1, got {wanted}")
    available = sorted(set(cpus))
    if not wanted:
        return []
    total = sum(wanted)
    if total > len(available):
        raise CoreAssignmentError(
            f"{len(wanted)} instance(s) need {total} cpus ({'+'.join(map(str, wanted))}) but "
            f"only {len(available)} are available ({format_cpu_list(available) or 'none'})"
        )
    known = {info.cpu: info for info in (topology or read_topology(available))}
    infos = [known.get(c, CpuInfo(cpu=c, core=1_000_000 + c, socket=0)) for c in available]
    sockets: dict[int, list[CpuInfo]] = {}
    for info in infos:
        sockets.setdefault(info.socket, []).append(info)
    socket_ids = sorted(sockets)
    queues = [_socket_order(sockets[s]) for s in socket_ids]
    order = sorted(range(len(wanted)), key=lambda i: (-wanted[i], i))
    result: list[list[int]]
    placement = _pack([wanted[i] for i in order], [len(q) for q in queues])
    if placement is None and span_sockets:
        flat = [cpu for queue in queues for cpu in queue]
        result = [[] for _ in wanted]
        start = 0
        for i in order:
            result[i] = sorted(flat[start : start + wanted[i]])
            start += wanted[i]
        return result
    if placement is None:
        sizes = ", ".join(
            f"socket {s}: {len(q)} cpus" for s, q in zip(socket_ids, queues, strict=True)
        )
        raise CoreAssignmentError(
            f"instances with threads {wanted} cannot be placed without spanning a socket "
            f"({sizes}; cpus {format_cpu_list(available)})"
        )
    result = [[] for _ in wanted]
    cursor = [0] * len(queues)
    for i, s in zip(order, placement, strict=True):
        take = queues[s][cursor[s] : cursor[s] + wanted[i]]
        cursor[s] += wanted[i]
        result[i] = sorted(take)
    return result
