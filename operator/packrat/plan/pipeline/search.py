"""InferLine's search over a pipeline's per-stage configurations, for one end-to-end P99 SLO.

A configuration gives every stage a :class:`~packrat.plan.provision.Config` (cores per
replica, serving batch, replicas); each replica runs Packrat's plan for its cores and batch;
the cost is the total of cores over all stages; it is feasible when the simulated
end-to-end P99 on the sample trace (:mod:`packrat.plan.pipeline.simulate`) is at most the SLO and no
stage runs above ``max_utilization`` (default 0.9) of its capacity at the trace's mean rate.
The headroom is not InferLine's: without it the search lands on stages at 99.9% utilization
that meet the SLO on the sample trace and miss it on the next trace of the same process
(measured: 22% misses, docs/measurements.md, issue 13).

Search (InferLine's planner, with two fallbacks for a tight core budget):

1. Start with every stage at its smallest batch on its biggest replica, with the fewest
   replicas that keep up with the arrivals it sees. If the critical path of batch-1
   latencies already exceeds the SLO nothing is feasible. Otherwise add one replica at a
   time to the bottleneck, the stage whose queueing delay (P99 time in the stage minus its
   batch-1 latency) is largest, until the pipeline is feasible. When the core budget has
   no room for another replica, the bottleneck's batch is increased instead; when even
   that fails, the start is retried on smaller replicas (half the cores, down to one).
2. Greedy cost-cutting: on every stage try "increase the batch" (with the fewest replicas,
   up to the current count, that stay feasible), "remove a replica" and "downgrade the
   replica size" (to one core less or half the cores, with its cheapest feasible batch and
   replica count); apply the feasible action that cuts cost most (an equal-cost batch
   increase only when it lowers P99); stop when none does.

Stage simulations are memoized by the configurations of the stage and its ancestors, so an
action re-simulates only the stage it touches and what lies downstream. :func:`exhaustive`
enumerates every configuration within a core budget (for tests, and the cost gap).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from packrat.plan.des import nearest_rank
from packrat.plan.pipeline.simulate import Pipeline, PipelineResult, PipelineSim, StageRun
from packrat.plan.provision import Config, Planner, ProvisionError, SimSettings, check_request
from packrat.plan.search import cheapest, fewest_feasible, finite

# finite: importable from here, as it was before it moved to packrat.plan.search
__all__ = ["Configs", "PipelineEvaluation", "PipelinePlanner", "exhaustive", "finite"]

Configs = tuple[Config, ...]  # one per stage, in the pipeline's topological order


@dataclass(frozen=True, slots=True)
class PipelineEvaluation:
    configs: Configs
    p99_ms: float
    miss_rate: float
    feasible: bool
    stage_p99_ms: tuple[float, ...]
    stage_wait_ms: tuple[float, ...]  # P99 time in the stage minus its batch-1 latency

    @property
    def cores(self) -> int:
        return sum(c.cores for c in self.configs)


class PipelinePlanner:
    """Evaluates pipeline configurations on one trace (memoized per stage) and searches."""

    def __init__(
        self,
        pipeline: Pipeline,
        trace_s: np.ndarray,
        *,
        slo_ms: float,
        max_cores: int | None = None,
        sim: SimSettings | None = None,
        max_utilization: float = 0.9,
    ) -> None:
        self.rate = check_request(slo_ms, trace_s)
        self.pipeline = pipeline
        self.names = list(pipeline.order)
        self.trace = trace_s
        self.slo_ms = slo_ms
        if not 0.0 < max_utilization <= 1.0:
            raise ProvisionError(f"max utilization must be in (0, 1], got {max_utilization!r}")
        self.max_utilization = max_utilization
        self.sim = sim or SimSettings()
        self.des = PipelineSim(pipeline, trace_s, **self.sim.des_options())
        self.scale = {n: self.des.scale_factor(n) for n in self.names}
        top = sum(pipeline.stages[n].cpus for n in self.names)
        self.max_cores = max_cores if max_cores is not None else 64 * top
        if self.max_cores < len(self.names):
            raise ProvisionError(
                f"--max-cores {self.max_cores} is fewer than one core per stage "
                f"({len(self.names)} stages)"
            )
        # the single-model planner's helpers (plans, batches, capacity) for each stage
        self.stage_planners = {
            n: Planner(
                pipeline.stages[n].table,
                trace_s,
                slo_ms=slo_ms,
                max_cpus=pipeline.stages[n].cpus,
                max_cores=self.max_cores,
                sim=self.sim,
            )
            for n in self.names
        }
        self._upstream = {
            n: [self.names.index(a) for a in pipeline.ancestors(n)] for n in self.names
        }
        self._stage_memo: dict[tuple[int, tuple[Config, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._memo: dict[Configs, PipelineEvaluation] = {}

    # -- building blocks -------------------------------------------------------------------
    def run(self, configs: Configs) -> PipelineResult:
        arrive: dict[str, np.ndarray] = {}
        done: dict[str, np.ndarray] = {}
        for i, name in enumerate(self.names):
            key = (i, tuple(configs[j] for j in [*self._upstream[name], i]))
            if key not in self._stage_memo:
                a = self.des.arrivals_at(name, done)
                c = configs[i]
                run = StageRun(self.stage_planners[name].instances(c.cpus, c.batch), c.replicas)
                self._stage_memo[key] = (a, self.des.stage(name, a, run))
            arrive[name], done[name] = self._stage_memo[key]
        return self.des.combine(arrive, done)

    def evaluate(self, configs: Configs) -> PipelineEvaluation:
        if configs not in self._memo:
            result = self.run(configs)
            p99 = result.p99_ms
            stage_p99, waits = [], []
            for name, c in zip(self.names, configs, strict=True):
                lat = result.stage_latencies(name)
                sp = nearest_rank(lat, 99.0) if lat.size else 0.0
                stage_p99.append(sp)
                waits.append(sp - self.service_ms(name, c) if lat.size else 0.0)
            self._memo[configs] = PipelineEvaluation(
                configs=configs,
                p99_ms=p99,
                miss_rate=result.miss_rate(self.slo_ms),
                feasible=p99 <= self.slo_ms
                and all(
                    c.replicas >= self.stable_replicas(n, c.cpus, c.batch)
                    for n, c in zip(self.names, configs, strict=True)
                ),
                stage_p99_ms=tuple(stage_p99),
                stage_wait_ms=tuple(waits),
            )
        return self._memo[configs]

    @property
    def evaluations(self) -> int:
        return len(self._memo)

    def service_ms(self, name: str, c: Config) -> float:
        """The stage's latency for one query alone (a batch of 1 on its plan's instances)."""
        table = self.pipeline.stages[name].table
        insts = self.stage_planners[name].instances(c.cpus, c.batch)
        return min(
            min(table[(t, bb)] for (tt, bb) in table if tt == t and bb <= b) for t, b in insts
        )

    def batches(self, name: str, cpus: int) -> list[int]:
        return self.stage_planners[name].batches(cpus)

    def stable_replicas(self, name: str, cpus: int, batch: int) -> int:
        """The fewest replicas that serve the stage's mean arrival rate at no more than
        ``max_utilization`` of their capacity (each instance at its best fill)."""
        sp = self.stage_planners[name]
        mu = sp.capacity(sp.instances(cpus, batch)) * self.max_utilization
        return max(1, math.ceil(self.rate * self.scale[name] / mu - 1e-9))

    def with_stage(self, configs: Configs, i: int, c: Config) -> Configs:
        return (*configs[:i], c, *configs[i + 1 :])

    def within_budget(self, configs: Configs) -> bool:
        return sum(c.cores for c in configs) <= self.max_cores

    def fewest_replicas(
        self, configs: Configs, i: int, cpus: int, batch: int, hi: int
    ) -> PipelineEvaluation | None:
        """Stage ``i`` at ``cpus``/``batch`` with the fewest replicas in [stable, hi] that
        keep the pipeline feasible (bisection: more replicas do not raise P99), or None."""
        name = self.names[i]
        others = sum(c.cores for j, c in enumerate(configs) if j != i)
        hi = min(hi, (self.max_cores - others) // cpus)
        lo = self.stable_replicas(name, cpus, batch) - 1  # known too few
        if self.scale[name] == 0.0:
            lo = 0  # never visited on this trace: one replica is enough
        # gallop up from the stability bound, then bisect
        return fewest_feasible(
            lo, hi, lambda n: self.evaluate(self.with_stage(configs, i, Config(cpus, batch, n)))
        )

    # -- the search --------------------------------------------------------------------------
    def start(self) -> tuple[PipelineEvaluation, list[str]]:
        """Step 1: the cheapest feasible start (smallest batch, biggest replicas, bottleneck
        replicas added one at a time). When the core budget runs out first, the start is
        retried with every replica capped at fewer cores (half, then down to 1), since small
        replicas fit a budget more finely. Infeasible: the lowest P99 reached."""
        top = max(self.pipeline.stages[n].cpus for n in self.names)
        caps = sorted({top, *(top >> k for k in range(1, top.bit_length())), 1}, reverse=True)
        best: tuple[PipelineEvaluation, list[str]] | None = None
        for cap in caps:
            ev, steps, budget_bound = self._start_at(cap)
            if ev.feasible or not budget_bound:
                return ev, steps
            if best is None or ev.p99_ms < best[0].p99_ms:
                best = (ev, steps)
        assert best is not None
        return best

    def _start_at(self, cap: int) -> tuple[PipelineEvaluation, list[str], bool]:
        """The start with replicas of at most ``cap`` cores; the flag says whether the core
        budget (rather than the SLO's latency floor) stopped it."""
        configs: list[Config] = []
        for name in self.names:
            cpus = min(cap, self.pipeline.stages[name].cpus)
            b = self.batches(name, cpus)[0]
            configs.append(Config(cpus, b, self.stable_replicas(name, cpus, b)))
        cur = tuple(configs)
        hop = self.sim.overhead_ms  # per stage visited, and once for the entry hop
        floor = hop + self.pipeline.critical_path(
            {n: self.service_ms(n, c) + hop for n, c in zip(self.names, cur, strict=True)}
        )
        if floor > self.slo_ms:
            msg = f"infeasible: the fastest path takes {floor:.1f} ms > SLO {self.slo_ms:.1f} ms"
            return self.evaluate(cur), [msg], False
        if not self.within_budget(cur):
            msg = "infeasible: keeping up with the mean rate exceeds the core budget"
            return self.evaluate(cur), [msg], True
        ev = self.evaluate(cur)
        added = 0
        while not ev.feasible:
            waits = ev.stage_wait_ms
            i = max(range(len(cur)), key=lambda j: (waits[j], -j))
            c = cur[i]
            nxt = self.with_stage(cur, i, Config(c.cpus, c.batch, c.replicas + 1))
            if not self.within_budget(nxt):
                # no core left for a replica: a larger batch at the bottleneck raises its
                # throughput at the same cost (InferLine would stop here)
                larger = [b for b in self.batches(self.names[i], c.cpus) if b > c.batch]
                if not larger:
                    return ev, ["infeasible: the core budget runs out"], True
                nxt = self.with_stage(cur, i, Config(c.cpus, larger[0], c.replicas))
            cur, added = nxt, added + 1
            ev = self.evaluate(cur)
        return ev, [f"start {self.label(ev.configs)} after {added} bottleneck replicas"], False

    def greedy(self) -> tuple[PipelineEvaluation, list[str]]:
        """InferLine's search: :meth:`start`, then greedy cost-cutting on every stage."""
        current, steps = self.start()
        if not current.feasible:
            return current, steps
        while True:
            options: list[tuple[int, int, float, str, PipelineEvaluation]] = []
            cfgs = current.configs
            for i, name in enumerate(self.names):
                c = cfgs[i]
                larger = [b for b in self.batches(name, c.cpus) if b > c.batch]
                if larger:
                    ev = self.fewest_replicas(cfgs, i, c.cpus, larger[0], c.replicas)
                    if ev is not None:
                        options.append((ev.cores, 0, ev.p99_ms, f"{name}: increase batch", ev))
                if c.replicas > 1:
                    ev = self.evaluate(
                        self.with_stage(cfgs, i, Config(c.cpus, c.batch, c.replicas - 1))
                    )
                    if ev.feasible:
                        options.append((ev.cores, 1, ev.p99_ms, f"{name}: remove a replica", ev))
                for smaller in sorted({c.cpus - 1, c.cpus // 2} - {0}, reverse=True):
                    ev = self.cheapest_at(cfgs, i, smaller, c.cores - 1)
                    if ev is not None:
                        label = f"{name}: downgrade to {smaller} cores"
                        options.append((ev.cores, 2, ev.p99_ms, label, ev))
            options.sort(key=lambda o: (o[0], o[2], o[1]))
            cost = current.cores
            # an equal-cost batch increase only when it lowers P99 (else the walk to the
            # largest batch never ends before the batch delay makes every batch the same)
            chosen = next(
                (
                    o
                    for o in options
                    if o[0] < cost or (o[0] == cost and o[1] == 0 and o[2] < current.p99_ms)
                ),
                None,
            )
            if chosen is None:
                return current, steps
            current = chosen[4]
            steps.append(f"{chosen[3]} -> {self.label(current.configs)}")

    def cheapest_at(
        self, configs: Configs, i: int, cpus: int, max_stage_cores: int
    ) -> PipelineEvaluation | None:
        """Stage ``i`` on ``cpus``-core replicas with its cheapest feasible batch and replica
        count using at most ``max_stage_cores``; batches are tried in the order of their
        capacity bound and skipped once that bound cannot beat the best found."""
        name = self.names[i]
        bounds = sorted((self.stable_replicas(name, cpus, b), b) for b in self.batches(name, cpus))
        best: PipelineEvaluation | None = None
        limit = max_stage_cores // cpus
        for floor, b in bounds:
            if floor > limit:
                break
            ev = self.fewest_replicas(configs, i, cpus, b, limit)
            if ev is not None and (
                best is None or (ev.cores, ev.p99_ms) < (best.cores, best.p99_ms)
            ):
                best = ev
                limit = ev.configs[i].replicas - 1
        return best

    def label(self, configs: Configs) -> str:
        return ", ".join(
            f"{n} {c.replicas}x{c.cpus}c/b{c.batch}"
            for n, c in zip(self.names, configs, strict=True)
        )


def exhaustive(
    planner: PipelinePlanner, *, max_replicas: int | None = None
) -> PipelineEvaluation | None:
    """The cheapest feasible configuration over every stage's replica size, batch and
    replica count within the core budget (ties: lower P99); None when none is feasible;
    simulated in order of cost, stopping at the first core count with a feasible one."""
    per_stage: list[list[Config]] = []
    for name in planner.names:
        opts: list[Config] = []
        top = planner.pipeline.stages[name].cpus
        for c in range(1, top + 1):
            for b in planner.batches(name, c):
                limit = planner.max_cores // c if max_replicas is None else max_replicas
                opts.extend(Config(c, b, n) for n in range(1, limit + 1))
        per_stage.append(opts)
    combos = (c for c in itertools.product(*per_stage) if planner.within_budget(c))
    return cheapest(((sum(c.cores for c in combo), combo) for combo in combos), planner.evaluate)
