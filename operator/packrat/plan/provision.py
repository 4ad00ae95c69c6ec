"""Provisioning for a P99 latency SLO at the fewest cores (InferLine's planner, on Packrat plans).

A configuration is ``(cpus per replica c, serving batch B, replicas n)``; each replica runs
Packrat's optimal plan for ``c`` cores and batch ``B`` (:mod:`packrat.plan.optimizer`), its
cost is ``n * c`` cores, and it is feasible when the simulated P99 latency on the sample
trace (:mod:`packrat.plan.des`) is at most the SLO.

The search is InferLine's: start from the cheapest configuration that can be feasible at all
(batch 1 on the biggest replica), with the fewest replicas that meet the SLO; then greedily
try "increase the batch", "remove a replica" and "downgrade the replica size" (to one core
less, or half the cores, each with its cheapest batch) and take the feasible action that
cuts cost most, until none does. Changing the batch or the replica size is followed by the
fewest replicas that make it feasible, so each action's cost is comparable; that count is
found by galloping up from the replicas that sustain the trace's mean rate and bisecting,
which assumes that more replicas do not raise P99 (true up to spreading noise).
:func:`exhaustive` enumerates every configuration, for tests and for reporting the greedy
search's cost gap.

Baselines (the coarse-grained way): one fat instance (all ``T`` cores, batch ``B``) per
replica, replicas sized for the trace's mean rate and for its peak rate (busiest 1 s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat.plan.des import SimResult, batch_latency_table, simulate
from packrat.plan.optimizer import Optimizer, Plan
from packrat.plan.search import fewest_feasible, finite
from packrat.plan.traces import mean_rate, peak_rate

Table = Mapping[tuple[int, int], float]


class ProvisionError(ValueError):
    """The request cannot be planned at all (bad SLO, empty trace, too few cores)."""


@dataclass(frozen=True, slots=True)
class SimSettings:
    """How the serving pods are simulated (see :func:`packrat.plan.des.simulate`)."""

    spread: str = "random"
    max_batch_delay_ms: float = 5.0
    queue_limit: int = 1024
    overhead_ms: float = 0.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Config:
    cpus: int
    batch: int
    replicas: int

    @property
    def cores(self) -> int:
        return self.cpus * self.replicas


@dataclass(frozen=True, slots=True)
class Evaluation:
    config: Config
    instances: tuple[tuple[int, int], ...]
    p99_ms: float
    miss_rate: float
    feasible: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.config.replicas,
            "cpus_per_replica": self.config.cpus,
            "batch": self.config.batch,
            "cores": self.config.cores,
            "simulated_p99_ms": finite(self.p99_ms),
            "slo_miss_rate": self.miss_rate,
            "feasible": self.feasible,
        }


@dataclass(slots=True)
class Provision:
    """The planner's answer."""

    best: Evaluation
    plan: Plan
    slo_ms: float
    baselines: dict[str, Evaluation]
    evaluations: int
    wall_s: float
    trace: dict[str, float]
    steps: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.best.feasible

    def to_dict(self) -> dict[str, Any]:
        c = self.best.config
        return {
            "replicas": c.replicas,
            "cpus_per_replica": c.cpus,
            "batch": c.batch,
            "plan": self.plan.to_dict(),
            "cores": c.cores,
            "simulated_p99_ms": finite(self.best.p99_ms),
            "slo_p99_ms": self.slo_ms,
            "slo_miss_rate": self.best.miss_rate,
            "feasible": self.feasible,
            "baselines": {name: ev.to_dict() for name, ev in self.baselines.items()},
            "search": {"evaluations": self.evaluations, "wall_s": self.wall_s, "steps": self.steps},
            "trace": self.trace,
        }


class Planner:
    """Evaluates configurations on one trace (memoized) and runs the searches."""

    def __init__(
        self,
        table: Table,
        trace_s: np.ndarray,
        *,
        slo_ms: float,
        max_cores: int | None = None,
        max_cpus: int | None = None,
        sim: SimSettings | None = None,
    ) -> None:
        self.rate = check_request(slo_ms, trace_s)
        self.table = dict(table)
        self.trace = trace_s
        self.slo_ms = slo_ms
        self.max_cpus = max_cpus or max(t for t, _ in self.table)
        self.max_cores = max_cores if max_cores is not None else 64 * self.max_cpus
        if self.max_cores < 1:
            raise ProvisionError(f"--max-cores must be >= 1, got {self.max_cores}")
        self.sim = sim or SimSettings()
        self.max_batch = max(b for _, b in self.table)
        self._opt: dict[int, Optimizer] = {}
        self._memo: dict[tuple[Config, bool], Evaluation] = {}

    # -- building blocks -------------------------------------------------------------------
    def optimizer(self, cpus: int) -> Optimizer:
        if cpus not in self._opt:
            self._opt[cpus] = Optimizer(
                self.table, cpus=cpus, max_batch=self.max_batch, alternatives=False
            )
        return self._opt[cpus]

    def batches(self, cpus: int) -> list[int]:
        """Serving batches to try: the profiled batch sizes this replica size can plan."""
        opt = self.optimizer(cpus)
        return [b for b in sorted({b for _, b in self.table}) if opt.feasible(b)]

    def instances(self, cpus: int, batch: int, *, fat: bool = False) -> tuple[tuple[int, int], ...]:
        if fat:
            return ((cpus, batch),)
        return tuple(self.optimizer(cpus).plan(batch).expand())

    def capacity(self, instances: tuple[tuple[int, int], ...]) -> float:
        """Queries per second one replica sustains at best (each instance at its best fill)."""
        total = 0.0
        for t, b in instances:
            lat = batch_latency_table(self.table, t, b)
            total += max(k / lat[k] for k in range(1, b + 1)) * 1000.0
        return total

    def min_stable_replicas(self, instances: tuple[tuple[int, int], ...]) -> int:
        """Replicas below which the mean rate exceeds capacity (the queue grows unboundedly)."""
        return max(1, math.ceil(self.rate / self.capacity(instances) - 1e-9))

    def run(self, config: Config, *, fat: bool = False) -> SimResult:
        s = self.sim
        return simulate(
            self.trace,
            self.table,
            self.instances(config.cpus, config.batch, fat=fat),
            replicas=config.replicas,
            spread=s.spread,
            max_batch_delay_ms=s.max_batch_delay_ms,
            queue_limit=s.queue_limit,
            overhead_ms=s.overhead_ms,
            seed=s.seed,
        )

    def evaluate(self, config: Config, *, fat: bool = False) -> Evaluation:
        key = (config, fat)
        if key not in self._memo:
            result = self.run(config, fat=fat)
            p99 = result.p99_ms
            self._memo[key] = Evaluation(
                config=config,
                instances=self.instances(config.cpus, config.batch, fat=fat),
                p99_ms=p99,
                miss_rate=result.miss_rate(self.slo_ms),
                feasible=p99 <= self.slo_ms,
            )
        return self._memo[key]

    @property
    def evaluations(self) -> int:
        return len(self._memo)

    def fewest_replicas(self, cpus: int, batch: int) -> Evaluation | None:
        """The feasible evaluation with the fewest replicas within ``max_cores``, or None."""
        if self.optimizer(cpus).latency(batch) > self.slo_ms:
            return None  # one batch alone already misses the SLO
        lo = self.min_stable_replicas(self.instances(cpus, batch)) - 1  # known infeasible
        # gallop up from the stability bound, then bisect (P99 falls with more replicas)
        return fewest_feasible(
            lo, self.max_cores // cpus, lambda n: self.evaluate(Config(cpus, batch, n))
        )

    # -- the searches ------------------------------------------------------------------------
    def greedy(self) -> tuple[Evaluation, list[str]]:
        """InferLine's search; returns the best evaluation (infeasible: the lowest P99)."""
        top = min(self.max_cpus, self.max_cores)
        first = self.batches(top)[0]
        steps: list[str] = []
        current = self.fewest_replicas(top, first)
        if current is None:
            return self._best_effort(top, first), ["infeasible: no replica count meets the SLO"]
        steps.append(f"start {_label(current.config)}")
        while True:
            c, b, n = current.config.cpus, current.config.batch, current.config.replicas
            options: list[tuple[int, int, str, Evaluation]] = []
            larger = [x for x in self.batches(c) if x > b]
            if larger:
                ev = self.fewest_replicas(c, larger[0])
                if ev is not None:
                    options.append((ev.config.cores, 0, "increase batch", ev))
            if n > 1:
                ev = self.evaluate(Config(c, b, n - 1))
                if ev.feasible:
                    options.append((ev.config.cores, 1, "remove a replica", ev))
            for smaller in sorted({c - 1, c // 2} - {0}, reverse=True):
                ev = self._cheapest_at(smaller)
                if ev is not None:
                    options.append((ev.config.cores, 2, "downgrade replica size", ev))
            options.sort(key=lambda o: (o[0], o[3].p99_ms, o[1]))
            cost = current.config.cores
            chosen = next((o for o in options if o[0] < cost or (o[0] == cost and o[1] == 0)), None)
            if chosen is None:
                return current, steps
            current = chosen[3]
            steps.append(f"{chosen[2]} -> {_label(current.config)}")

    def _cheapest_at(self, cpus: int) -> Evaluation | None:
        """Downgrading the replica size re-picks the batch: the cheapest feasible batch there
        (a smaller replica often wants a smaller batch)."""
        found = [ev for b in self.batches(cpus) if (ev := self.fewest_replicas(cpus, b))]
        return min(found, key=lambda ev: (ev.config.cores, ev.p99_ms), default=None)

    def _best_effort(self, cpus: int, batch: int) -> Evaluation:
        """When nothing is feasible: the most replicas the cores allow, at batch 1."""
        n = max(1, self.max_cores // cpus)
        return self.evaluate(Config(cpus, batch, n))

    def baseline(self, rate: float) -> Evaluation:
        """Fat replicas (T cores, one instance) sized for ``rate``; T is the largest profiled
        thread count up to ``max_cpus``.

        The batch is the one with the highest throughput whose single batch fits the SLO
        (batch 1 when none does).
        """
        # the fattest profiled instance (a partial profile may lack t = max_cpus)
        t = max((tt for tt, _ in self.table if tt <= self.max_cpus), default=self.max_cpus)
        sizes = [b for (tt, b) in self.table if tt == t]
        if not sizes:
            raise ProvisionError(f"the profile has no point with at most {self.max_cpus} threads")
        fits = [b for b in sizes if self.table[(t, b)] <= self.slo_ms] or [min(sizes)]
        batch = max(fits, key=lambda b: (b / self.table[(t, b)], -b))
        mu = self.capacity(((t, batch),))
        n = max(1, math.ceil(rate / mu - 1e-9))
        return self.evaluate(Config(t, batch, n), fat=True)

    def baselines(self) -> dict[str, Evaluation]:
        return {
            "mean": self.baseline(self.rate),
            "peak": self.baseline(peak_rate(self.trace, window_s=1.0)),
        }


def exhaustive(planner: Planner) -> Evaluation | None:
    """The cheapest feasible configuration over every replica size, batch and replica count
    within ``max_cores`` (ties: lower P99); None when none is feasible."""
    best: Evaluation | None = None
    for c in range(1, min(planner.max_cpus, planner.max_cores) + 1):
        for b in planner.batches(c):
            for n in range(1, planner.max_cores // c + 1):
                ev = planner.evaluate(Config(c, b, n))
                if ev.feasible and (
                    best is None or (ev.config.cores, ev.p99_ms) < (best.config.cores, best.p99_ms)
                ):
                    best = ev
    return best


def check_request(slo_ms: float, trace_s: np.ndarray) -> float:
    """Refuse an SLO that is not a number of ms > 0, and an empty trace (both planners'
    inputs); return the trace's mean arrival rate (its arrival count when it has no span)."""
    if not (math.isfinite(slo_ms) and slo_ms > 0):
        raise ProvisionError(f"the SLO must be a number of ms > 0, got {slo_ms!r}")
    if trace_s.size == 0:
        raise ProvisionError("the trace has no arrivals")
    return mean_rate(trace_s) or float(trace_s.size)


def _label(c: Config) -> str:
    return f"{c.replicas}x{c.cpus}c/b{c.batch}"


def trace_summary(trace_s: np.ndarray, rate: float) -> dict[str, float | int]:
    """What a plan was made for: the sample's size, length, mean and busiest-second rate."""
    return {
        "arrivals": int(trace_s.size),
        "duration_s": float(trace_s[-1] - trace_s[0]) if trace_s.size else 0.0,
        "mean_rate": rate,
        "peak_rate_1s": peak_rate(trace_s, window_s=1.0),
    }


def provision(
    table: Table,
    trace_s: np.ndarray,
    *,
    slo_ms: float,
    max_cores: int | None = None,
    max_cpus: int | None = None,
    sim: SimSettings | None = None,
    model: str | None = None,
) -> Provision:
    """Plan replicas, replica size and batch for ``slo_ms`` on ``trace_s`` (see module doc)."""
    start = time.perf_counter()
    planner = Planner(
        table, trace_s, slo_ms=slo_ms, max_cores=max_cores, max_cpus=max_cpus, sim=sim
    )
    best, steps = planner.greedy()
    baselines = planner.baselines()
    plan = Optimizer(
        planner.table, cpus=best.config.cpus, max_batch=best.config.batch, model=model
    ).plan(best.config.batch)
    return Provision(
        best=best,
        plan=plan,
        slo_ms=slo_ms,
        baselines=baselines,
        evaluations=planner.evaluations,
        wall_s=time.perf_counter() - start,
        trace=trace_summary(trace_s, planner.rate),
        steps=steps,
    )
