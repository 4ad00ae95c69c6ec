"""Provisioning for a P99 latency SLO at the fewest cores (InferLine's planner, on Packrat plans).

A configuration is ``(cpus per replica c, serving batch B, replicas n, plan shape)``; each
replica runs Packrat's optimal plan for ``c`` cores and batch ``B`` (:mod:`packrat.plan.
optimizer`), or the per-core plan (the best plan of single-thread instances only: more
throughput per core, a slower full batch), its cost is ``n * c`` cores, and it is feasible
when the simulated P99 latency on the sample trace (:mod:`packrat.plan.des`) is at most the
SLO **and** the replicas run at no more than ``max_utilization`` (default 0.9) of their
capacity at the trace's sustained rate (its busiest ``UTILIZATION_WINDOW_S``, the whole
trace when shorter). Capacity is what a backlogged replica serves: every instance runs full
batches, ``sum b_i / L(t_i, b_i)`` (not each instance at its best fill, which a backlog
never chooses).

Why the headroom: a configuration at 93-99% utilisation meets the SLO on the trace it was
planned on and misses it on the next trace of the same process (measured: 5 of 5 fresh
traces over the SLO at 100/s; at 400/s a plan that saturated at 386/s). For the same
reason the answer is **validated**: the chosen configuration is simulated on ``resamples``
block-bootstrap resamples of the trace (blocks of the trace in another order, some twice,
another spreading seed) and gets more replicas until it meets the SLO on every one; a trace
too short for the SLO's tail (fewer than ``MIN_TAIL_QUERIES`` queries beyond the P99) is
planned with a warning that says how long a trace would be enough.

The search is InferLine's: start from the cheapest configuration that can be feasible at all
(batch 1 on the biggest replica), with the fewest replicas that meet the SLO; then greedily
try "increase the batch", "remove a replica", "downgrade the replica size" (to one core
less, or half the cores, each with its cheapest batch and plan shape) and "the other plan
shape" (same cores, its cheapest batch) and take the feasible action that cuts cost most,
until none does; an equal-cost batch increase is taken only when it lowers P99 (otherwise
the search walks to the largest batch, whose P99 holds worst out of sample). Changing the
batch, the shape or the replica size is followed by the fewest replicas that make it
feasible, so each action's cost is comparable; that count is found by galloping up from the
replicas the utilisation cap allows and bisecting, which assumes that more replicas do not
raise P99 (true up to spreading noise). No batch is pruned for its full-batch latency: with
a batching delay a large batch rarely fills, so only a plan whose single query already
misses the SLO is skipped. :func:`exhaustive` enumerates every configuration, for tests and
for reporting the greedy search's cost gap.

When nothing is feasible the answer says why and what would be: the cores the SLO needs
(searched again within ``64 x T`` cores) or, when no core count is enough, the tightest SLO
a configuration met on this trace; what is served meanwhile is the lowest P99 within the
core budget.

Baselines (the coarse-grained way): one fat instance (all ``T`` cores, batch ``B``) per
replica, replicas sized for the trace's mean rate and for its peak rate (busiest 1 s); they
are judged by the SLO alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

import numpy as np

from packrat.plan.des import SimResult, batch_latency_table, simulate
from packrat.plan.optimizer import Optimizer, Plan
from packrat.plan.search import cheapest, fewest_feasible, finite
from packrat.plan.traces import block_resample, mean_rate, peak_rate

Table = Mapping[tuple[int, int], float]
Instances = tuple[tuple[int, int], ...]

SHAPES = ("packrat", "per_core")
"""Plan shapes: Packrat's optimal plan for (c, B), and the best plan of 1-thread instances."""
UTILIZATION_WINDOW_S = 60.0
"""Utilisation is taken at the trace's busiest window of this length (a quarter of the trace
when that is shorter): a step or a busy hour is the load the replicas must sustain, not the
day's mean."""
MAX_VALIDATION_ARRIVALS = 100_000
"""A resample holds at most this many arrivals (bounded work: a fraction of a second of DES
each)."""
MIN_TAIL_QUERIES = 50
"""A P99 resting on fewer queries beyond it (fewer than 5000 arrivals) does not hold out of
sample (measured: at 20/s a 60 s trace, 12 queries beyond the P99, planned 93 ms for an SLO
of 100 ms; fresh traces gave 106-125 ms)."""
WIDE_CORES_PER_CPU = 64
"""The default core budget, ``64 x T``; also how far an infeasible answer looks for the cores
the SLO needs."""


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

    def des_options(self, *, seed: int | None = None) -> DesOptions:
        """These settings as the keywords of :func:`~packrat.plan.des.simulate` and
        :class:`~packrat.plan.pipeline.simulate.PipelineSim` (``seed``: another than the
        settings' own, for a resample or a unit of its own)."""
        return DesOptions(
            spread=self.spread,
            max_batch_delay_ms=self.max_batch_delay_ms,
            queue_limit=self.queue_limit,
            overhead_ms=self.overhead_ms,
            seed=self.seed if seed is None else seed,
        )


class DesOptions(TypedDict):
    """:class:`SimSettings` as the simulators' keywords (``**sim.des_options()``)."""

    spread: str
    max_batch_delay_ms: float
    queue_limit: int
    overhead_ms: float
    seed: int


@dataclass(frozen=True, slots=True)
class Robustness:
    """How far an answer must hold beyond its own trace (see the module docstring).

    ``max_utilization``: the highest planned utilisation (sustained rate over capacity);
    ``resamples``: block-bootstrap resamples the answer must also meet the SLO on (0: none);
    ``block_s``: their block length (default: the trace's span / 20, at least 1 s);
    ``horizon_s``: their length, when longer than the trace (a P99 over ten minutes sees
    busier stretches than one over the minute a sample holds; at most
    ``MAX_VALIDATION_ARRIVALS`` arrivals);
    ``per_core``: whether per-core plans are searched besides Packrat's optimal plans."""

    max_utilization: float = 0.9
    resamples: int = 4
    block_s: float | None = None
    horizon_s: float = 600.0
    per_core: bool = True

    def check(self) -> None:
        if not (math.isfinite(self.max_utilization) and 0.0 < self.max_utilization <= 1.0):
            raise ProvisionError(
                f"the utilisation cap must be in (0, 1], got {self.max_utilization!r}"
            )
        if not 0 <= self.resamples <= 64:
            raise ProvisionError(f"resamples must be in [0, 64], got {self.resamples!r}")
        if self.block_s is not None and not (math.isfinite(self.block_s) and self.block_s > 0):
            raise ProvisionError(f"the resampling block must be > 0 s, got {self.block_s!r}")
        if not (math.isfinite(self.horizon_s) and self.horizon_s >= 0):
            raise ProvisionError(f"the validation horizon must be >= 0 s, got {self.horizon_s!r}")


@dataclass(frozen=True, slots=True)
class Config:
    cpus: int
    batch: int
    replicas: int
    shape: str = "packrat"

    @property
    def cores(self) -> int:
        return self.cpus * self.replicas

    def to_dict(self) -> dict[str, Any]:
        """The configuration's fields as every report names them (an evaluation's, the
        answer's): the order of the keys is the order printed."""
        return {
            "replicas": self.replicas,
            "cpus_per_replica": self.cpus,
            "batch": self.batch,
            "plan_shape": self.shape,
        }

    @property
    def label(self) -> str:
        suffix = "/per-core" if self.shape == "per_core" else ""
        return f"{self.replicas}x{self.cpus}c/b{self.batch}{suffix}"


@dataclass(frozen=True, slots=True)
class Evaluation:
    config: Config
    instances: Instances
    p99_ms: float
    miss_rate: float
    feasible: bool
    utilization: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "cores": self.config.cores,
            "simulated_p99_ms": finite(self.p99_ms),
            "slo_miss_rate": self.miss_rate,
            "utilization": finite(self.utilization),
            "feasible": self.feasible,
        }


@dataclass(frozen=True, slots=True)
class Validation:
    """The answer on the held-out resamples: their P99s, and the replicas it took."""

    resamples: int
    """How many block-bootstrap resamples of the trace there are (``Robustness.resamples``;
    0: validation is off)."""
    p99_ms: tuple[float, ...]
    """The answer's simulated P99 on each resample, in milliseconds (empty when none ran: no
    resamples, or an answer that misses the SLO on the trace itself)."""
    passed: bool
    """Whether the answer meets the SLO on every resample (with none: on the trace)."""
    added_replicas: int = 0
    """Replicas added to the search's answer until it did."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "resamples": self.resamples,
            "p99_ms": [finite(p) for p in self.p99_ms],
            "passed": self.passed,
            "added_replicas": self.added_replicas,
        }


@dataclass(frozen=True, slots=True)
class Infeasibility:
    """Why nothing met the SLO, and what would: the cores it needs, or the tightest SLO."""

    reason: str
    cores_needed: int | None = None
    config: str | None = None
    tightest_slo_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    max_utilization: float = 0.9
    validation: Validation | None = None
    infeasible: Infeasibility | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.best.feasible

    def to_dict(self) -> dict[str, Any]:
        c = self.best.config
        return {
            **c.to_dict(),
            "plan": self.plan.to_dict(),
            "cores": c.cores,
            "simulated_p99_ms": finite(self.best.p99_ms),
            "slo_p99_ms": self.slo_ms,
            "slo_miss_rate": self.best.miss_rate,
            "utilization": finite(self.best.utilization),
            "max_utilization": self.max_utilization,
            "feasible": self.feasible,
            "validation": None if self.validation is None else self.validation.to_dict(),
            "infeasible": None if self.infeasible is None else self.infeasible.to_dict(),
            "warnings": list(self.warnings),
            "baselines": {name: ev.to_dict() for name, ev in self.baselines.items()},
            "search": {"evaluations": self.evaluations, "wall_s": self.wall_s, "steps": self.steps},
            "trace": self.trace,
        }


@dataclass(frozen=True, slots=True)
class _Checked:
    """One replica count of the answer, on the trace and on every resample."""

    evaluation: Evaluation
    p99_ms: tuple[float, ...]
    feasible: bool


def backlogged_capacity(table: Table, instances: Sequence[tuple[int, int]]) -> float:
    """Queries per second a replica serves when backlogged: every instance runs full batches
    (``sum b / L(t, b)``); the dispatcher keeps up to twice each batch outstanding, so a
    backlogged instance never runs a partial one."""
    return sum(b / table[(t, b)] * 1000.0 for t, b in instances)


def sustained_rate(trace_s: np.ndarray, window_s: float = UTILIZATION_WINDOW_S) -> float:
    """The arrival rate of the trace's busiest ``window_s`` (of a quarter of the trace when
    that is shorter); what utilisation is measured against."""
    span = float(trace_s[-1] - trace_s[0]) if trace_s.size > 1 else 0.0
    window = min(window_s, span / 4.0)
    if window <= 0:
        return mean_rate(trace_s) or float(trace_s.size)
    return max(peak_rate(trace_s, window_s=window), mean_rate(trace_s))


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
        robust: Robustness | None = None,
        on_simulation: Callable[[], None] | None = None,
    ) -> None:
        self.rate = check_request(slo_ms, trace_s)
        self.on_simulation = on_simulation  # told after each simulation (progress)
        self.table = dict(table)
        self.trace = trace_s
        self.slo_ms = slo_ms
        self.max_cpus = max_cpus or max(t for t, _ in self.table)
        self.max_cores = max_cores if max_cores is not None else WIDE_CORES_PER_CPU * self.max_cpus
        if self.max_cores < 1:
            raise ProvisionError(f"--max-cores must be >= 1, got {self.max_cores}")
        self.sim = sim or SimSettings()
        self.robust = robust or Robustness()
        self.robust.check()
        self.sustained = sustained_rate(trace_s)
        self.max_batch = max(b for _, b in self.table)
        per_core = {k: v for k, v in self.table.items() if k[0] == 1}
        self._tables = {"packrat": self.table, "per_core": per_core}
        self.shapes = SHAPES if self.robust.per_core and per_core else SHAPES[:1]
        self._opt: dict[tuple[int, str], Optimizer] = {}
        self._memo: dict[tuple[Config, bool], Evaluation] = {}
        self._resampled: list[np.ndarray] | None = None
        self.path: list[Evaluation] = []  # the greedy search's configurations, in order

    # -- building blocks -------------------------------------------------------------------
    def optimizer(self, cpus: int, shape: str = "packrat") -> Optimizer:
        key = (cpus, shape)
        if key not in self._opt:
            self._opt[key] = Optimizer(
                self._tables[shape], cpus=cpus, max_batch=self.max_batch, alternatives=False
            )
        return self._opt[key]

    def batches(self, cpus: int, shape: str = "packrat") -> list[int]:
        """Serving batches to try: the profiled batch sizes this replica size can plan."""
        opt = self.optimizer(cpus, shape)
        return [b for b in sorted({b for _, b in self.table}) if opt.feasible(b)]

    def instances(
        self, cpus: int, batch: int, *, fat: bool = False, shape: str = "packrat"
    ) -> Instances:
        if fat:
            return ((cpus, batch),)
        return tuple(self.optimizer(cpus, shape).plan(batch).expand())

    def config_instances(self, config: Config) -> Instances:
        return self.instances(config.cpus, config.batch, shape=config.shape)

    def capacity(self, instances: Instances) -> float:
        """Queries per second one replica serves backlogged (:func:`backlogged_capacity`)."""
        return backlogged_capacity(self.table, instances)

    def utilization(self, config: Config, *, fat: bool = False) -> float:
        """The sustained rate over the capacity of ``config``'s replicas."""
        inst = self.instances(config.cpus, config.batch, fat=fat, shape=config.shape)
        return self.sustained / (config.replicas * self.capacity(inst))

    def min_stable_replicas(self, instances: Instances) -> int:
        """The fewest replicas within the utilisation cap at the sustained rate (fewer are
        infeasible, and below ``1 / max_utilization`` of it the queue grows unboundedly)."""
        mu = self.capacity(instances) * self.robust.max_utilization
        return max(1, math.ceil(self.sustained / mu - 1e-9))

    def floor_ms(self, instances: Instances) -> float:
        """The lowest latency any query can see on these instances: one query alone on the
        fastest; a plan whose floor exceeds the SLO cannot meet it at any replica count."""
        fastest = min(batch_latency_table(self.table, t, b)[1] for t, b in set(instances))
        return fastest + self.sim.overhead_ms

    def run(
        self,
        config: Config,
        *,
        fat: bool = False,
        trace: np.ndarray | None = None,
        seed: int | None = None,
    ) -> SimResult:
        if self.on_simulation is not None:
            self.on_simulation()
        return simulate(
            self.trace if trace is None else trace,
            self.table,
            self.instances(config.cpus, config.batch, fat=fat, shape=config.shape),
            replicas=config.replicas,
            **self.sim.des_options(seed=seed),
        )

    def evaluate(self, config: Config, *, fat: bool = False) -> Evaluation:
        """Simulate ``config`` on the trace (memoized). Feasible: P99 within the SLO and, for
        a searched configuration, utilisation within the cap (a baseline: the SLO alone)."""
        key = (config, fat)
        if key not in self._memo:
            result = self.run(config, fat=fat)
            p99 = result.p99_ms
            util = self.utilization(config, fat=fat)
            capped = fat or util <= self.robust.max_utilization + 1e-12
            self._memo[key] = Evaluation(
                config=config,
                instances=self.instances(config.cpus, config.batch, fat=fat, shape=config.shape),
                p99_ms=p99,
                miss_rate=result.miss_rate(self.slo_ms),
                feasible=p99 <= self.slo_ms and capped,
                utilization=util,
            )
        return self._memo[key]

    @property
    def evaluations(self) -> int:
        return len(self._memo)

    def searched(self) -> list[Evaluation]:
        """Every configuration simulated so far (the baselines' fat ones excluded)."""
        return [ev for (_, fat), ev in self._memo.items() if not fat]

    def fewest_replicas(self, cpus: int, batch: int, shape: str = "packrat") -> Evaluation | None:
        """The feasible evaluation with the fewest replicas within ``max_cores``, or None."""
        instances = self.instances(cpus, batch, shape=shape)
        if self.floor_ms(instances) > self.slo_ms:
            return None  # a query alone already misses the SLO
        lo = self.min_stable_replicas(instances) - 1  # known infeasible
        # gallop up from the utilisation bound, then bisect (P99 falls with more replicas)
        return fewest_feasible(
            lo, self.max_cores // cpus, lambda n: self.evaluate(Config(cpus, batch, n, shape))
        )

    # -- the searches ------------------------------------------------------------------------
    def greedy(self) -> tuple[Evaluation, list[str]]:
        """InferLine's search; returns the best evaluation (infeasible: the lowest P99)."""
        top = min(self.max_cpus, self.max_cores)
        starts = [
            ev
            for shape in self.shapes
            if self.batches(top, shape)
            and (ev := self.fewest_replicas(top, self.batches(top, shape)[0], shape))
        ]
        if not starts:
            return self.best_effort(), ["infeasible: no replica count meets the SLO"]
        current = min(starts, key=lambda ev: (ev.config.cores, ev.p99_ms))
        steps = [f"start {current.config.label}"]
        self.path = [current]
        while True:
            options = self._options(current)
            options.sort(key=lambda o: (o[0], o[3].p99_ms, o[1]))
            cost = current.config.cores
            chosen = next(
                (
                    o
                    for o in options
                    if o[0] < cost or (o[0] == cost and o[1] == 0 and o[3].p99_ms < current.p99_ms)
                ),
                None,
            )
            if chosen is None:
                return current, steps
            current = chosen[3]
            self.path.append(current)
            steps.append(f"{chosen[2]} -> {current.config.label}")

    def _options(self, current: Evaluation) -> list[tuple[int, int, str, Evaluation]]:
        """The feasible neighbours of ``current``: (cores, kind, action, evaluation)."""
        c, b, n, shape = (
            current.config.cpus,
            current.config.batch,
            current.config.replicas,
            current.config.shape,
        )
        options: list[tuple[int, int, str, Evaluation]] = []
        larger = [x for x in self.batches(c, shape) if x > b]
        if larger:
            ev = self.fewest_replicas(c, larger[0], shape)
            if ev is not None:
                options.append((ev.config.cores, 0, "increase batch", ev))
        if n > 1:
            ev = self.evaluate(replace(current.config, replicas=n - 1))
            if ev.feasible:
                options.append((ev.config.cores, 1, "remove a replica", ev))
        for smaller in sorted({c - 1, c // 2} - {0}, reverse=True):
            ev = self._cheapest_at(smaller, self.shapes)
            if ev is not None:
                options.append((ev.config.cores, 2, "downgrade replica size", ev))
        others = tuple(s for s in self.shapes if s != shape)
        if others and (ev := self._cheapest_at(c, others)) is not None:
            options.append((ev.config.cores, 3, "change plan shape", ev))
        return options

    def _cheapest_at(self, cpus: int, shapes: Sequence[str]) -> Evaluation | None:
        """Downgrading the replica size (or changing the plan shape) re-picks the batch: the
        cheapest feasible batch there (a smaller replica often wants a smaller batch)."""
        found = [
            ev
            for shape in shapes
            for b in self.batches(cpus, shape)
            if (ev := self.fewest_replicas(cpus, b, shape))
        ]
        return min(found, key=lambda ev: (ev.config.cores, ev.p99_ms), default=None)

    def best_effort(self) -> Evaluation:
        """When nothing is feasible within the budget: the lowest P99 (then the fewest
        misses) of the most replicas the budget allows, at each shape's smallest batch on
        the biggest replica and, per core, on 1-core replicas."""
        top = min(self.max_cpus, self.max_cores)
        candidates = []
        for cpus in sorted({top, 1}):
            for shape in self.shapes:
                sizes = self.batches(cpus, shape)
                if sizes:
                    n = max(1, self.max_cores // cpus)
                    candidates.append(self.evaluate(Config(cpus, sizes[0], n, shape)))
        return min(candidates, key=lambda ev: (ev.p99_ms, ev.miss_rate, ev.config.cores))

    # -- beyond the trace --------------------------------------------------------------------
    def resampled(self) -> list[np.ndarray]:
        """The held-out resamples (block bootstrap of the trace; seeded, made once)."""
        if self._resampled is None:
            span = float(self.trace[-1] - self.trace[0]) if self.trace.size > 1 else 0.0
            block = self.robust.block_s or max(1.0, span / 20.0)
            length = max(span, min(self.robust.horizon_s, MAX_VALIDATION_ARRIVALS / self.rate))
            self._resampled = [
                block_resample(
                    self.trace, block_s=block, seed=self.sim.seed * 1000 + i + 1, length_s=length
                )
                for i in range(self.robust.resamples)
            ]
        return self._resampled

    def validate(self, best: Evaluation) -> tuple[Evaluation, Validation]:
        """``best`` with the fewest replicas (at least its own) that also meet the SLO on
        every resample, each simulated with another spreading seed; when no count within the
        budget does, ``best`` itself with ``passed`` false."""
        traces = self.resampled()
        if not traces or not best.feasible:
            return best, Validation(len(traces), (), best.feasible)
        cfg = best.config

        def check(n: int) -> _Checked:
            config = replace(cfg, replicas=n)
            ev = self.evaluate(config)
            p99s = tuple(
                self.run(config, trace=t, seed=self.sim.seed + i + 1).p99_ms
                for i, t in enumerate(traces)
            )
            return _Checked(ev, p99s, ev.feasible and max(p99s) <= self.slo_ms)

        first = check(cfg.replicas)
        found = (
            first
            if first.feasible
            else fewest_feasible(cfg.replicas, self.max_cores // cfg.cpus, check)
        )
        if found is None:
            return best, Validation(len(traces), first.p99_ms, False)
        added = found.evaluation.config.replicas - cfg.replicas
        return found.evaluation, Validation(len(traces), found.p99_ms, True, added)

    # -- baselines ---------------------------------------------------------------------------
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

    def plan(self, config: Config, *, model: str | None = None) -> Plan:
        """The plan each replica of ``config`` runs (with the fat and per-core alternatives)."""
        plan = Optimizer(
            self._tables[config.shape], cpus=config.cpus, max_batch=config.batch, model=model
        ).plan(config.batch)
        if config.shape == "packrat":
            return plan
        fat = self.table.get((config.cpus, config.batch))
        return replace(plan, fat_latency_ms=fat)

    def widened(self, max_cores: int, slo_ms: float | None = None) -> Planner:
        """The same request with another core budget (or SLO)."""
        return Planner(
            self.table,
            self.trace,
            slo_ms=self.slo_ms if slo_ms is None else slo_ms,
            max_cores=max_cores,
            max_cpus=self.max_cpus,
            sim=self.sim,
            robust=self.robust,
            on_simulation=self.on_simulation,
        )


def exhaustive(planner: Planner) -> Evaluation | None:
    """The cheapest feasible configuration over every replica size, plan shape, batch and
    replica count within ``max_cores`` (ties: lower P99); None when none is feasible;
    simulated in order of cost, stopping at the first core count with a feasible one."""
    configs = (
        Config(c, b, n, shape)
        for c in range(1, min(planner.max_cpus, planner.max_cores) + 1)
        for shape in planner.shapes
        for b in planner.batches(c, shape)
        for n in range(1, planner.max_cores // c + 1)
    )
    return cheapest(((config.cores, config) for config in configs), planner.evaluate)


def explain_infeasible(planner: Planner) -> tuple[Infeasibility, Evaluation | None]:
    """Why ``planner``'s SLO cannot be met, and what can: the cores it needs (searched within
    ``64 x T`` cores when the budget is smaller) or the tightest SLO met on this trace; with
    it, the configuration to serve meanwhile when cheaper than the budget's best effort (the
    cheapest one within 25% of that tightest SLO: reaching it exactly takes every replica
    the budget allows, pushing queueing to zero)."""
    wide_cores = WIDE_CORES_PER_CPU * planner.max_cpus
    wide = planner if planner.max_cores >= wide_cores else planner.widened(wide_cores)
    if wide is not planner:
        ev, _ = wide.greedy()
        if ev.feasible:
            reason = (
                f"the SLO needs {ev.config.cores} cores ({ev.config.label}); "
                f"the budget is {planner.max_cores}"
            )
            return Infeasibility(reason, cores_needed=ev.config.cores, config=ev.config.label), None
    else:
        wide.best_effort()
    capped = [
        ev.p99_ms
        for ev in wide.searched()
        if ev.utilization <= planner.robust.max_utilization and math.isfinite(ev.p99_ms)
    ]
    tightest = min(capped, default=math.inf)
    floor = min(wide.floor_ms(((t, b),)) for (t, b) in planner.table if t <= planner.max_cpus)
    if floor > planner.slo_ms:
        why = f"a query alone takes at least {floor:.1f} ms > SLO {planner.slo_ms:g} ms"
    else:
        why = (
            f"queueing on this trace keeps P99 above {planner.slo_ms:g} ms "
            f"within {wide_cores} cores"
        )
    if not math.isfinite(tightest):
        return Infeasibility(f"{why}; every configuration tried sheds queries"), None
    relaxed = planner.widened(planner.max_cores, slo_ms=tightest * 1.25)
    serve, _ = relaxed.greedy()
    reason = f"{why}; the tightest SLO met on this trace is {tightest:.1f} ms"
    found = planner.evaluate(serve.config) if serve.feasible else None
    return Infeasibility(reason, tightest_slo_ms=round(tightest, 3)), found


def check_request(slo_ms: float, trace_s: np.ndarray) -> float:
    """Refuse an SLO that is not a number of ms > 0, and an empty trace (both planners'
    inputs); return the trace's mean arrival rate (its arrival count when it has no span)."""
    if not (math.isfinite(slo_ms) and slo_ms > 0):
        raise ProvisionError(f"the SLO must be a number of ms > 0, got {slo_ms!r}")
    if trace_s.size == 0:
        raise ProvisionError("the trace has no arrivals")
    return mean_rate(trace_s) or float(trace_s.size)


def tail_warning(trace_s: np.ndarray, *, percentile: float = 99.0) -> str | None:
    """A warning when the trace holds too few queries beyond ``percentile`` for its
    estimate to hold out of sample (:data:`MIN_TAIL_QUERIES`); it says how long would do."""
    tail = trace_s.size * (1.0 - percentile / 100.0)
    if tail >= MIN_TAIL_QUERIES:
        return None
    need = math.ceil(MIN_TAIL_QUERIES / (1.0 - percentile / 100.0))
    rate = mean_rate(trace_s)
    longer = f" (about {math.ceil(need / rate)} s at {rate:.1f}/s)" if rate > 0 else ""
    return (
        f"the trace has {trace_s.size} arrivals: its P{percentile:g} rests on {tail:.0f} "
        f"queries; at least {need} arrivals{longer} are needed for it to hold on other traces"
    )


def trace_summary(trace_s: np.ndarray, rate: float) -> dict[str, float | int]:
    """What a plan was made for: the sample's size, length, mean and busiest-second rate."""
    return {
        "arrivals": int(trace_s.size),
        "duration_s": float(trace_s[-1] - trace_s[0]) if trace_s.size else 0.0,
        "mean_rate": rate,
        "peak_rate_1s": peak_rate(trace_s, window_s=1.0),
        "sustained_rate": sustained_rate(trace_s) if trace_s.size else 0.0,
    }


def provision(planner: Planner, *, model: str | None = None) -> Provision:
    """Plan replicas, replica size, plan shape and batch for the planner's SLO on its trace
    (see the module docstring); ``model`` names the plan's model."""
    start = time.perf_counter()
    best, steps = planner.greedy()
    warnings = [w] if (w := tail_warning(planner.trace)) else []
    validation: Validation | None = None
    infeasible: Infeasibility | None = None
    if best.feasible:
        best, validation = planner.validate(best)
        if validation.added_replicas:
            steps.append(f"validate on {validation.resamples} resamples -> {best.config.label}")
        if not validation.passed:
            warnings.append(
                f"no replica count within the budget meets the SLO on all "
                f"{validation.resamples} resamples of the trace"
            )
    else:
        infeasible, serve = explain_infeasible(planner)
        if serve is not None and serve.config.cores < best.config.cores:
            best = serve
    return Provision(
        best=best,
        plan=planner.plan(best.config, model=model),
        slo_ms=planner.slo_ms,
        baselines=planner.baselines(),
        evaluations=planner.evaluations,
        wall_s=time.perf_counter() - start,
        trace=trace_summary(planner.trace, planner.rate),
        steps=steps,
        max_utilization=planner.robust.max_utilization,
        validation=validation,
        infeasible=infeasible,
        warnings=warnings,
    )
