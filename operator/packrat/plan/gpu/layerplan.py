"""The per-layer plan of a cold model on a GPU (DeepPlan), and the two-stream schedule that runs it.

A model is a sequence of stages ("layers": ResNet-50's stem, 16 bottlenecks and head; a
transformer's embeddings, blocks and head). Its weights live in pinned host memory; each stage
not resident in device memory is either

- ``load``: copied host-to-device on the copy stream, in forward order, while earlier stages
  run (pipelined, as in PipeSwitch and DeepPlan), or
- ``host``: read in place by the GPU's kernels from mapped pinned host memory (direct host
  access, nothing copied; pays where the stage reads little of its weights, e.g. an embedding
  lookup, or where its transfer costs more than the slower in-place execution).

Per stage the profile gives bytes, the copy time, the execution time resident and the execution
time reading in place (``None``: the stage cannot run from host memory). The cold latency of a
placement is :func:`packrat.plan.pool.lcache.pipeline_latency` over ``copy_s = copy`` for loaded
stages (0 otherwise) and ``compute_s = exec_host`` for in-place stages (``exec`` otherwise).

:func:`best_placement` minimises it exactly: a dynamic programme over stages whose state is the
pair (copy stream free at, last stage done at); the recurrence is monotone in both, so a state
dominated in both coordinates never leads to a better end and only the Pareto frontier is kept
(exact, and small in practice: at most one state per distinct copy-stream time). Tested
against enumerating all ``2^n`` placements.

:func:`in_place_always` picks the stages read in place even when warm (an embedding lookup
reads a few rows: keeping its table on the device buys nothing), within a small share of the
warm latency; their bytes never take device memory.

:func:`lcache_curve` turns a profile into LCache's
:class:`~packrat.plan.pool.lcache.Curve`: for each resident prefix ``p``, the best placement
of the rest, so the cross-model policy (:func:`~packrat.plan.pool.lcache.plan_curves`) sees
the GPU tier's real cold latencies.

:func:`schedule` is the ordering the executor follows, as data: two streams of operations
(copy ``i``; signal ``copied[i]`` / wait ``copied[i]``; run ``i``; signal ``ran[i]``) that a
backend (CUDA streams and events, or threads and events on CPU) executes in order;
``lookahead`` bounds how far copies run ahead (scratch memory for at most ``lookahead + 1``
in-flight stages). :func:`simulate` replays a schedule with given durations: it equals the
pipeline recurrence (tested), so what is executed is what was planned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from packrat.plan.pool.lcache import Curve, pipeline_latency

__all__ = [
    "LayerPlan",
    "Op",
    "Placement",
    "Schedule",
    "StageProfile",
    "best_placement",
    "cold_latency",
    "in_place_always",
    "interleave",
    "lcache_curve",
    "schedule",
    "simulate",
    "warm_latency",
]

Placement = Literal["resident", "load", "host"]


@dataclass(frozen=True)
class StageProfile:
    """One stage as measured: bytes, host-to-device copy seconds, execution seconds resident
    and reading its weights in place from host memory (None: not possible)."""

    name: str
    bytes: int
    copy_s: float
    exec_s: float
    exec_host_s: float | None = None

    def __post_init__(self) -> None:
        values = [self.copy_s, self.exec_s] + (
            [] if self.exec_host_s is None else [self.exec_host_s]
        )
        if self.bytes < 0 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"stage {self.name}: bytes and times must be finite and >= 0")


@dataclass(frozen=True)
class LayerPlan:
    placements: tuple[Placement, ...]
    latency_s: float


def _times(
    stages: Sequence[StageProfile], placements: Sequence[Placement]
) -> tuple[list[float], list[float]]:
    if len(stages) != len(placements):
        raise ValueError("one placement per stage")
    copy: list[float] = []
    run: list[float] = []
    for s, p in zip(stages, placements, strict=True):
        if p == "host" and s.exec_host_s is None:
            raise ValueError(f"stage {s.name} cannot be read in place")
        copy.append(s.copy_s if p == "load" else 0.0)
        run.append(s.exec_host_s if p == "host" and s.exec_host_s is not None else s.exec_s)
    return copy, run


def cold_latency(
    stages: Sequence[StageProfile], placements: Sequence[Placement], *, lookahead: int | None = None
) -> float:
    copy, run = _times(stages, placements)
    return pipeline_latency(copy, run, lookahead=lookahead)


def warm_latency(stages: Sequence[StageProfile]) -> float:
    return sum(s.exec_s for s in stages)


def in_place_always(stages: Sequence[StageProfile], tolerance: float = 0.01) -> frozenset[int]:
    """The stages read in place even when the model is warm (DeepPlan keeps BERT's word
    embedding on the host): those whose in-place execution costs little more than resident,
    taken by the least extra time per byte saved, while their extra time sums to at most
    ``tolerance`` of the warm latency. Their bytes never take device memory."""
    budget = tolerance * warm_latency(stages)
    candidates = sorted(
        (max(s.exec_host_s - s.exec_s, 0.0) / s.bytes, i)
        for i, s in enumerate(stages)
        if s.exec_host_s is not None and s.bytes > 0
    )
    chosen: set[int] = set()
    used = 0.0
    for _, i in candidates:
        extra = max((stages[i].exec_host_s or 0.0) - stages[i].exec_s, 0.0)
        if used + extra <= budget:
            chosen.add(i)
            used += extra
    return frozenset(chosen)


def best_placement(
    stages: Sequence[StageProfile],
    resident_prefix: int = 0,
    *,
    allow_host: bool = True,
    fixed_host: frozenset[int] = frozenset(),
) -> LayerPlan:
    """The least cold latency with the first ``resident_prefix`` stages resident, the stages in
    ``fixed_host`` read in place (:func:`in_place_always`), and each other stage loaded or read
    in place (unbounded lookahead; ties go to ``load``, then fewer in-place stages)."""
    if not 0 <= resident_prefix <= len(stages):
        raise ValueError(f"resident prefix {resident_prefix} outside 0..{len(stages)}")
    if any(stages[i].exec_host_s is None for i in fixed_host):
        raise ValueError("a stage that cannot be read in place is fixed in place")
    # state: (copy stream free at, last stage done at) -> placements so far
    frontier: dict[tuple[float, float], tuple[Placement, ...]] = {(0.0, 0.0): ()}
    for i, s in enumerate(stages):
        options: list[Placement] = ["resident"] if i < resident_prefix else ["load"]
        if i in fixed_host:
            options = ["host"]
        elif i >= resident_prefix and allow_host and s.exec_host_s is not None:
            options.append("host")
        nxt: dict[tuple[float, float], tuple[Placement, ...]] = {}
        for (load_end, run_end), chosen in frontier.items():
            for p in options:
                if p == "load":
                    load = load_end + s.copy_s
                    state = (load, max(run_end, load) + s.exec_s)
                elif p == "host":
                    state = (load_end, run_end + (s.exec_host_s or 0.0))
                else:
                    state = (load_end, run_end + s.exec_s)
                if state not in nxt:
                    nxt[state] = (*chosen, p)
        frontier = _pareto(nxt)
    (_, end), placements = min(frontier.items(), key=lambda kv: (kv[0][1], kv[1].count("host")))
    return LayerPlan(placements, end)


def _pareto(
    states: dict[tuple[float, float], tuple[Placement, ...]],
) -> dict[tuple[float, float], tuple[Placement, ...]]:
    """The states no other state beats in both coordinates (sorted sweep, O(k log k))."""
    out: dict[tuple[float, float], tuple[Placement, ...]] = {}
    best_run = math.inf
    for key in sorted(states):
        if key[1] < best_run:
            out[key] = states[key]
            best_run = key[1]
    return out


def lcache_curve(
    name: str,
    rate: float,
    stages: Sequence[StageProfile],
    *,
    allow_host: bool = True,
    fixed_host: frozenset[int] = frozenset(),
) -> Curve:
    """LCache's curve for this model on the GPU tier: for each resident prefix ``p = 0..n``,
    the cold latency of the best placement of the rest, and the device bytes of the prefix
    (the ``fixed_host`` stages in it take none)."""
    lat = tuple(
        best_placement(stages, p, allow_host=allow_host, fixed_host=fixed_host).latency_s
        for p in range(len(stages) + 1)
    )
    sizes = [0]
    for i, s in enumerate(stages):
        sizes.append(sizes[-1] + (0 if i in fixed_host else s.bytes))
    return Curve(name, rate, lat, tuple(sizes))


OpKind = Literal["copy", "run", "signal", "wait"]


@dataclass(frozen=True)
class Op:
    """One operation on a stream: ``copy``/``run`` stage ``stage``; ``signal``/``wait`` the event
    ``(event, stage)`` where event is ``copied`` or ``ran``."""

    kind: OpKind
    stage: int
    event: Literal["copied", "ran", ""] = ""


@dataclass(frozen=True)
class Schedule:
    copy: tuple[Op, ...]
    compute: tuple[Op, ...]
    placements: tuple[Placement, ...]


def schedule(
    placements: Sequence[Placement], *, lookahead: int | None = None, load_first: bool = False
) -> Schedule:
    """The two streams' operations for one cold pass (see module doc). ``load_first``: the
    baseline that copies every loaded stage before running any (load-then-run)."""
    if lookahead is not None and lookahead < 0:
        raise ValueError("lookahead must be >= 0")
    loaded = [i for i, p in enumerate(placements) if p == "load"]
    gates = set()  # stages whose completion a later copy waits for
    copy_ops: list[Op] = []
    for i in loaded:
        j = i - 1 - lookahead if lookahead is not None else -1
        if j >= 0:
            copy_ops.append(Op("wait", j, "ran"))
            gates.add(j)
        copy_ops += [Op("copy", i), Op("signal", i, "copied")]
    compute_ops: list[Op] = []
    if load_first and loaded:
        if lookahead is not None:
            raise ValueError("load_first copies everything first: no lookahead")
        compute_ops.append(Op("wait", loaded[-1], "copied"))
    for i, p in enumerate(placements):
        if p == "load" and not load_first:
            compute_ops.append(Op("wait", i, "copied"))
        compute_ops.append(Op("run", i))
        if i in gates:
            compute_ops.append(Op("signal", i, "ran"))
    return Schedule(tuple(copy_ops), tuple(compute_ops), tuple(placements))


def simulate(sched: Schedule, copy_s: Sequence[float], run_s: Sequence[float]) -> float:
    """Replay ``sched`` with the given durations: each stream runs its operations in order, a
    wait blocks until its event was signalled. Returns when the last operation ends."""
    signalled: dict[tuple[str, int], float] = {}
    streams = {"copy": list(sched.copy), "compute": list(sched.compute)}
    clock = {"copy": 0.0, "compute": 0.0}
    pos = {"copy": 0, "compute": 0}
    progress = True
    while progress:
        progress = False
        for name, ops in streams.items():
            while pos[name] < len(ops):
                op = ops[pos[name]]
                if op.kind == "wait":
                    key = (op.event, op.stage)
                    if key not in signalled:
                        break
                    clock[name] = max(clock[name], signalled[key])
                elif op.kind == "signal":
                    signalled[(op.event, op.stage)] = clock[name]
                else:
                    clock[name] += copy_s[op.stage] if op.kind == "copy" else run_s[op.stage]
                pos[name] += 1
                progress = True
    if any(pos[n] < len(streams[n]) for n in streams):
        raise ValueError("schedule deadlocks: a wait's event is never signalled")
    return clock["compute"]


def interleave(sched: Schedule) -> list[tuple[Literal["copy", "compute"], Op]]:
    """An order in which to submit both streams' operations such that every wait is submitted
    after the signal it waits for (CUDA's ``cudaStreamWaitEvent`` on an event not yet recorded
    does not wait), each stream's own order kept."""
    streams: dict[Literal["copy", "compute"], tuple[Op, ...]] = {
        "copy": sched.copy,
        "compute": sched.compute,
    }
    pos = {"copy": 0, "compute": 0}
    done: set[tuple[str, int]] = set()
    out: list[tuple[Literal["copy", "compute"], Op]] = []
    while any(pos[n] < len(ops) for n, ops in streams.items()):
        moved = False
        for name, ops in streams.items():
            while pos[name] < len(ops):
                op = ops[pos[name]]
                if op.kind == "wait" and (op.event, op.stage) not in done:
                    break
                if op.kind == "signal":
                    done.add((op.event, op.stage))
                out.append((name, op))
                pos[name] += 1
                moved = True
        if not moved:
            raise ValueError("schedule deadlocks: a wait's event is never signalled")
    return out
