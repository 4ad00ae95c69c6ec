"""Inference pipelines: several models in a DAG, simulated end to end (InferLine's estimator).

A :class:`Pipeline` is a set of named stages (each a model with its own profile) and
directed edges between them; an edge carries the fraction of the queries reaching its
source that take it (InferLine's scale factors; 1 for a plain chain, below 1 for a cascade
or a conditional route). Root stages (no incoming edge) see every query.

The simulation (:class:`PipelineSim`) walks the stages in topological order and simulates
each stage with the single-model DES (:func:`packrat.plan.des.simulate`: Service spreading,
the dispatcher, TorchServe's batch-or-delay, profiled batch latencies), on the arrivals that
stage actually sees:

- a query takes edge ``p -> s`` with probability ``fraction``, drawn independently per edge
  and query from a seed keyed by the edge's names (so declaration order does not matter);
- it visits ``s`` when it visits a parent and takes that parent's edge to ``s``, and it
  arrives at ``s`` when the last such parent has answered it (a join waits for all of them);
- a query shed anywhere (``inf``) fails end to end, and fails every stage after it;
- it is answered when the last stage it visits has answered it: the end-to-end latency is
  that time minus its arrival;
- ``overhead_ms`` is one HTTP hop's cost (proxies, the router, the dispatcher): it is added
  once per stage a query visits (inside that stage's simulation, so it delays every stage
  after it) and once for the client's hop to the router, so a path of ``k`` stages costs
  ``(k + 1) * overhead_ms`` more than its stages' compute.

Stages downstream of a stage only see that stage's completion times, so simulating stage by
stage is exact for a DAG (no feedback). Pure: numpy only, seeded, no clock, no I/O.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from packrat.plan.des import SimResult, SimulationError, nearest_rank, simulate

if TYPE_CHECKING:
    from packrat.plan.pipeline.branch import Condition

Table = Mapping[tuple[int, int], float]
# One HTTP hop's cost when nothing better is known (ms): the median per hop measured through
# the emulator's kube-proxy, the router and a stage's dispatcher on the shared 2-core machine
# (docs/measurements.md, issue 13: 21 ms end to end over two hops for a 0.03 ms model).
DEFAULT_HOP_OVERHEAD_MS = 10.0
Instances = tuple[tuple[int, int], ...]


class PipelineError(ValueError):
    """The pipeline is malformed (unknown stage, cycle, bad fraction); the message says where."""


@dataclass(frozen=True, slots=True, eq=False)
class Stage:
    """One model of the pipeline: its name, its profile ``L(t, b)`` and its largest replica."""

    name: str
    table: Table
    max_cpus: int | None = None

    @property
    def cpus(self) -> int:
        """The largest replica size: ``max_cpus`` or the profile's largest thread count."""
        return self.max_cpus or max(t for t, _ in self.table)


@dataclass(frozen=True, slots=True)
class Edge:
    """``src -> dst``, taken by ``fraction`` of the queries visiting ``src``; with ``when``
    (a :class:`packrat.plan.pipeline.branch.Condition`) the router takes it when ``src``'s
    answer says so, and ``fraction`` is the expected share the planner simulates."""

    src: str
    dst: str
    fraction: float = 1.0
    when: Condition | None = None


@dataclass(frozen=True, slots=True)
class StageRun:
    """How one stage is served: each replica runs ``instances``; ``replicas`` of them."""

    instances: Instances
    replicas: int


class Pipeline:
    """A validated DAG of stages (see the module docstring)."""

    def __init__(self, stages: Sequence[Stage], edges: Sequence[Edge] = ()) -> None:
        if not stages:
            raise PipelineError("a pipeline needs at least one stage")
        names = [s.name for s in stages]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PipelineError(f"duplicate stage name(s): {', '.join(dupes)}")
        for s in stages:
            if not s.name:
                raise PipelineError("a stage needs a name")
            if not s.table:
                raise PipelineError(f"stage {s.name!r}: empty profile")
        seen: set[tuple[str, str]] = set()
        for e in edges:
            for end in (e.src, e.dst):
                if end not in names:
                    raise PipelineError(f"edge {e.src} -> {e.dst}: unknown stage {end!r}")
            if e.src == e.dst:
                raise PipelineError(f"edge {e.src} -> {e.dst}: a stage cannot feed itself")
            if (e.src, e.dst) in seen:
                raise PipelineError(f"edge {e.src} -> {e.dst} is declared twice")
            seen.add((e.src, e.dst))
            if not (math.isfinite(e.fraction) and 0.0 <= e.fraction <= 1.0):
                raise PipelineError(
                    f"edge {e.src} -> {e.dst}: fraction must be in [0, 1], got {e.fraction!r}"
                )
        self.stages = {s.name: s for s in stages}
        self.edges = tuple(edges)
        self.order = topological_order(names, self.edges)

    def parents(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == name]

    def children(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.src == name]

    @property
    def roots(self) -> list[str]:
        return [n for n in self.order if not self.parents(n)]

    def ancestors(self, name: str) -> list[str]:
        """Every stage upstream of ``name``, in topological order."""
        found: set[str] = set()
        todo = [e.src for e in self.parents(name)]
        while todo:
            n = todo.pop()
            if n not in found:
                found.add(n)
                todo.extend(e.src for e in self.parents(n))
        return [n for n in self.order if n in found]

    def critical_path(self, weight: Mapping[str, float]) -> float:
        """The heaviest root-to-leaf path with per-stage weights (edges of fraction 0 are
        never taken, so they are not part of any path)."""
        best: dict[str, float] = {}
        for n in self.order:
            up = [best[e.src] for e in self.parents(n) if e.fraction > 0 and e.src in best]
            if self.parents(n) and not up:
                continue  # unreachable
            best[n] = weight[n] + max(up, default=0.0)
        return max(best.values())


def topological_order(names: list[str], edges: Sequence[Edge]) -> list[str]:
    """Kahn's algorithm, stable in declaration order; a cycle is an error naming its stages."""
    indeg = {n: 0 for n in names}
    for e in edges:
        indeg[e.dst] += 1
    ready = [n for n in names if indeg[n] == 0]
    out: list[str] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for e in edges:
            if e.src == n:
                indeg[e.dst] -= 1
                if indeg[e.dst] == 0:
                    ready.append(e.dst)
    if len(out) < len(names):
        cyc = ", ".join(n for n in names if n not in out)
        raise PipelineError(f"the edges form a cycle through: {cyc}")
    return out


@dataclass(frozen=True, slots=True)
class PipelineResult:
    """End-to-end latencies (ms, ``inf`` when failed) in arrival order, and per stage the
    completion times (ms, NaN where the query does not visit it)."""

    latencies_ms: np.ndarray
    arrive_ms: Mapping[str, np.ndarray]
    done_ms: Mapping[str, np.ndarray]

    @property
    def queries(self) -> int:
        return int(self.latencies_ms.size)

    @property
    def p99_ms(self) -> float:
        return nearest_rank(self.latencies_ms, 99.0)

    def percentile(self, q: float) -> float:
        return nearest_rank(self.latencies_ms, q)

    def miss_rate(self, slo_ms: float) -> float:
        return float((self.latencies_ms > slo_ms).mean()) if self.queries else 0.0

    def stage_latencies(self, name: str) -> np.ndarray:
        """Time from arrival at the stage to its answer, for the queries that visit it."""
        a, d = self.arrive_ms[name], self.done_ms[name]
        m = ~np.isnan(a)
        with np.errstate(invalid="ignore"):
            out: np.ndarray = np.where(np.isinf(a[m]), np.inf, d[m] - a[m])
        return out


class PipelineSim:
    """One trace through one pipeline; stages are simulated one at a time so a planner can
    reuse upstream results (:meth:`stage`) when only a downstream stage changes."""

    def __init__(
        self,
        pipeline: Pipeline,
        arrivals_s: np.ndarray | Sequence[float],
        *,
        seed: int = 0,
        spread: str = "random",
        max_batch_delay_ms: float = 5.0,
        queue_limit: int = 1024,
        overhead_ms: float = 0.0,
    ) -> None:
        arr = np.asarray(arrivals_s, dtype=np.float64)
        if arr.ndim != 1 or (arr.size and np.any(np.diff(arr) < 0)):
            raise SimulationError("arrivals must be a sorted 1-D array of timestamps")
        self.pipeline = pipeline
        self.arrivals_ms = arr * 1000.0
        self.seed = seed
        self.settings: dict[str, float | int | str] = {
            "spread": spread,
            "max_batch_delay_ms": max_batch_delay_ms,
            "queue_limit": queue_limit,
            "overhead_ms": overhead_ms,
        }
        n = arr.size
        self.taken = {
            (e.src, e.dst): _draw(seed, e, n) for e in pipeline.edges
        }  # which queries take each edge (given they visit its source)
        self.visits: dict[str, np.ndarray] = {}
        for name in pipeline.order:
            ins = pipeline.parents(name)
            v = np.ones(n, dtype=bool) if not ins else np.zeros(n, dtype=bool)
            for e in ins:
                v |= self.visits[e.src] & self.taken[(e.src, e.dst)]
            self.visits[name] = v

    def scale_factor(self, name: str) -> float:
        """The fraction of the trace's queries that visit ``name`` (InferLine's s_m)."""
        v = self.visits[name]
        return float(v.mean()) if v.size else 0.0

    def arrivals_at(self, name: str, done: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per query, when it reaches ``name`` (ms; NaN: it does not visit; inf: failed
        upstream), from the parents' completion times ``done``."""
        ins = self.pipeline.parents(name)
        if not ins:
            return self.arrivals_ms.copy()
        out = np.full(self.arrivals_ms.size, np.nan)
        for e in ins:
            m = self.visits[e.src] & self.taken[(e.src, e.dst)]
            out[m] = np.fmax(out[m], done[e.src][m])
        return out

    def stage(self, name: str, arrive_ms: np.ndarray, run: StageRun) -> np.ndarray:
        """Completion times (ms) at ``name`` for queries arriving at ``arrive_ms``."""
        done = np.full(arrive_ms.size, np.nan)
        failed = np.isinf(arrive_ms)
        done[failed] = math.inf
        live = np.flatnonzero(np.isfinite(arrive_ms))
        if live.size == 0:
            return done
        order = live[np.argsort(arrive_ms[live], kind="stable")]
        times = arrive_ms[order]
        result: SimResult = simulate(
            times / 1000.0,
            self.pipeline.stages[name].table,
            run.instances,
            replicas=run.replicas,
            seed=self.seed + zlib.crc32(name.encode()),
            **self.settings,  # type: ignore[arg-type]
        )
        done[order] = times + result.latencies_ms
        return done

    def run(self, runs: Mapping[str, StageRun]) -> PipelineResult:
        """Simulate every stage with ``runs[name]`` and combine end to end."""
        missing = [n for n in self.pipeline.order if n not in runs]
        if missing:
            raise PipelineError(f"no configuration for stage(s): {', '.join(missing)}")
        arrive: dict[str, np.ndarray] = {}
        done: dict[str, np.ndarray] = {}
        for name in self.pipeline.order:
            arrive[name] = self.arrivals_at(name, done)
            done[name] = self.stage(name, arrive[name], runs[name])
        return self.combine(arrive, done)

    def combine(
        self, arrive: Mapping[str, np.ndarray], done: Mapping[str, np.ndarray]
    ) -> PipelineResult:
        finish = np.full(self.arrivals_ms.size, -math.inf)
        for name in self.pipeline.order:
            d = done[name]
            m = ~np.isnan(d)
            finish[m] = np.maximum(finish[m], d[m])
        entry = float(self.settings["overhead_ms"])  # the client's hop to the router
        return PipelineResult(
            latencies_ms=finish - self.arrivals_ms + entry,
            arrive_ms=dict(arrive),
            done_ms=dict(done),
        )


def _draw(seed: int, edge: Edge, n: int) -> np.ndarray:
    if edge.fraction >= 1.0:
        return np.ones(n, dtype=bool)
    if edge.fraction <= 0.0:
        return np.zeros(n, dtype=bool)
    key = zlib.crc32(f"{edge.src}\0{edge.dst}".encode())
    rng = np.random.default_rng([seed, key])
    drawn: np.ndarray = rng.random(n) < edge.fraction
    return drawn


def simulate_pipeline(
    arrivals_s: np.ndarray | Sequence[float],
    pipeline: Pipeline,
    runs: Mapping[str, StageRun],
    **settings: float | int | str,
) -> PipelineResult:
    """Simulate ``pipeline`` on a trace with per-stage ``runs`` (see :class:`PipelineSim`)."""
    return PipelineSim(pipeline, arrivals_s, **settings).run(runs)  # type: ignore[arg-type]
