"""Packrat's microbenchmark, measured for real: the plan against fat and one-per-core.

For each batch size B the optimizer's plan, the fat instance (T threads, batch B) and one
1-thread instance per core (B split evenly) run on the same T cores, each configuration's
instances concurrently as pinned worker processes on disjoint cores. A configuration's
latency is the time from the first instance starting its batch to the last one finishing.

Shared machines are noisy, and noise drifts: so the configurations are interleaved over the
repetitions (A B C, B C A, C A B, ...: rotating also removes any order effect), every worker
loads the model once and stays alive across repetitions and batch sizes, and results are
medians with their spread, never one run.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from packrat.plan.baselines import BASELINES, baseline_pairs, even_split, expected_latency
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.padding import PaddedPlans, padding_horizon
from packrat.plan.profile import EAGER, ENGINES_KEY, Profile
from packrat.profiler.client import (
    EngineTarget,
    HandlerTarget,
    Worker,
    WorkerSource,
    worker_source,
)
from packrat.profiler.measure import check_pinning
from packrat.profiler.profiler import ProfilerError, ProfileSettings, profile_cpus, run_profile
from packrat.profiler.stats import Summary, summarize
from packrat.runtime.cpus import CoreAssignmentError, assign_cores, format_cpu_list
from packrat.runtime.zoo import ZooError, model_digest

__all__ = [
    "BatchResult",
    "BenchConfig",
    "ConfigResult",
    "bench_configs",
    "even_split",
    "run_bench",
]

CONFIG_NAMES = ("plan", *BASELINES)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One configuration: instances (threads, batch), each later pinned to its own cores."""

    name: str
    instances: tuple[tuple[int, int], ...]
    expected_ms: float | None
    engine: str = EAGER  # what its instances run (packrat.runtime.engines)

    @property
    def label(self) -> str:
        counts: dict[tuple[int, int], int] = {}
        for pair in self.instances:
            counts[pair] = counts.get(pair, 0) + 1
        ordered = sorted(counts.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
        shape = "+".join(f"{n}x{t}t/b{b}" for (t, b), n in ordered)
        return shape if self.engine == EAGER else f"{shape} {self.engine}"


def fat_engine(plan: Plan) -> str:
    """The engine of the fastest fat instance the optimizer compared ``plan`` with."""
    prefix = "fat_engine_"
    found = [a.name[len(prefix) :] for a in plan.alternatives if a.name.startswith(prefix)]
    return found[0] if found else plan.engine


def burst_pairs(plan: Plan) -> tuple[tuple[int, int], ...]:
    """The plan's instances, each with the requests a burst of ``plan.batch`` gives it under
    the dispatcher's routing rule: its own batch for an exact plan; for a padded plan (its
    instances hold more than the batch) some run less, and an idle one is left out."""
    pairs = plan.expand()
    if plan.capacity == plan.batch:
        return tuple(pairs)
    from packrat.serve.dispatcher.routing import choose_instance

    batches = [b for _, b in pairs]
    given = [0] * len(pairs)
    for _ in range(plan.batch):
        i = choose_instance(given, batches)
        assert i is not None  # fewer requests than the plan holds: always a place
        given[i] += 1
    return tuple((t, n) for (t, _), n in zip(pairs, given, strict=True) if n)


def bench_configs(plan: Plan, table: dict[tuple[int, int], float]) -> list[BenchConfig]:
    """The plan, the fat instance (of the fastest fat engine) and one 1-thread instance per
    core for ``plan.batch``."""
    configs = [BenchConfig("plan", burst_pairs(plan), plan.expected_latency_ms, engine=plan.engine)]
    for name in BASELINES:
        pairs = baseline_pairs(name, cpus=plan.cpus, batch=plan.batch)
        engine = fat_engine(plan) if name == "fat" else plan.engine
        expected = plan.fat_latency_ms if name == "fat" else expected_latency(pairs, table)
        configs.append(BenchConfig(name, pairs, expected, engine=engine))
    return configs


@dataclass(slots=True)
class ConfigResult:
    config: BenchConfig
    cores: list[list[int]]
    samples_ms: list[float] = field(default_factory=list)

    @property
    def summary(self) -> Summary:
        return summarize(self.samples_ms)

    def to_dict(self) -> dict[str, Any]:
        s = self.summary
        return {
            "label": self.config.label,
            "instances": [
                {"threads": t, "batch": b, "cpus": format_cpu_list(c)}
                for (t, b), c in zip(self.config.instances, self.cores, strict=True)
            ],
            "expected_ms": self.config.expected_ms,
            "median_ms": s.p50,
            "p25_ms": s.p25,
            "p75_ms": s.p75,
            "min_ms": s.min,
            "max_ms": s.max,
            "mean_ms": s.mean,
            "samples_ms": self.samples_ms,
        }


@dataclass(slots=True)
class BatchResult:
    batch: int
    plan: Plan
    configs: dict[str, ConfigResult]

    def median(self, name: str) -> float:
        return self.configs[name].summary.p50

    @property
    def measured_speedup(self) -> float:
        return self.median("fat") / self.median("plan")

    @property
    def per_core_speedup(self) -> float | None:
        if "per_core" not in self.configs:  # a subset was benched (e.g. plan and fat)
            return None
        return self.median("fat") / self.median("per_core")

    @property
    def expected_speedup(self) -> float | None:
        return self.plan.expected_speedup

    @property
    def actual_over_expected(self) -> float | None:
        expected = self.expected_speedup
        return None if expected is None else self.measured_speedup / expected

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "plan_label": self.plan.label,
            "plan": self.plan.to_dict(),
            "configs": {name: r.to_dict() for name, r in self.configs.items()},
            "measured_speedup": self.measured_speedup,
            "expected_speedup": self.expected_speedup,
            "actual_over_expected": self.actual_over_expected,
            "per_core_speedup": self.per_core_speedup,
        }


class WorkerPool:
    """Workers keyed by (threads, cores): configurations on the same cores share them."""

    def __init__(
        self,
        spec: str,
        *,
        startup_timeout_s: float = 300.0,
        handler: HandlerTarget | None = None,
        source: WorkerSource | None = None,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.timeout = startup_timeout_s
        self.source = source or worker_source("forked", spec, handler)
        self.workers: dict[tuple[int, tuple[int, ...], str], Worker] = {}
        # other engines' workers (packrat.runtime.engines), from their own sources
        self.engine_sources: dict[str, WorkerSource] = {}

    def get_all(
        self, wanted: Sequence[tuple[int, Sequence[int]]], engine: str = EAGER
    ) -> list[Worker]:
        """Workers for every (threads, cores), starting missing ones concurrently."""
        keys = [(t, tuple(sorted(c)), engine) for t, c in wanted]
        new = [k for k in dict.fromkeys(keys) if k not in self.workers]
        source = self.source if engine == EAGER else self.engine_sources[engine]
        for t, cores, _ in new:
            self.workers[(t, cores, engine)] = source.spawn(cpus=cores, threads=t)
        for key in new:
            ready = self.workers[key].wait_ready(timeout=self.timeout)
            check_pinning(ready, cores=key[1], threads=key[0])
        return [self.workers[k] for k in keys]

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
        self._close_sources()

    def kill(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()
        self._close_sources()

    def _close_sources(self) -> None:
        for source in self.engine_sources.values():
            source.close()
        self.engine_sources.clear()

    def add_engines(self, profile: Profile, *, kind: str) -> None:
        """Sources for the converted engines the profile kept (their artefacts)."""
        records = profile.meta.extra.get(ENGINES_KEY, {})
        for engine in profile.engines:
            if engine == EAGER or engine in self.engine_sources:
                continue
            record = records.get(engine, {}) if isinstance(records, dict) else {}
            path = (record.get("artefact") or {}).get("path")
            target = EngineTarget(engine, Path(path) if path else None)
            self.engine_sources[engine] = worker_source(kind, self.spec, None, target)


def run_once(workers: Sequence[Worker], batches: Sequence[int], *, timeout: float) -> float:
    """One synchronised run: every instance starts its batch now; ms until the last ends."""
    for worker, batch in zip(workers, batches, strict=True):
        worker.send({"cmd": "run", "batch": batch})
    replies = [w.recv(timeout=timeout) for w in workers]
    start = min(float(r["start"]) for r in replies)
    end = max(float(r["end"]) for r in replies)
    return (end - start) * 1000.0


def ensure_profile(
    *,
    spec: str,
    cpus: int,
    batches: Sequence[int],
    profile: Profile | None,
    save_to: Path | None,
    point_budget_s: float,
    stream: TextIO | None,
) -> Profile:
    """The given profile (checked against the model and T), or a quick one measured now."""
    try:
        digest = model_digest(spec)
    except ZooError as exc:
        raise ProfilerError(str(exc)) from None
    if profile is not None:
        if profile.meta.model_digest and profile.meta.model_digest != digest:
            raise ProfilerError(
                f"the profile is for model {profile.meta.model!r} (digest "
                f"{profile.meta.model_digest[:19]}...), not {spec!r}"
            )
        if cpus > profile.meta.cpus > 0:
            raise ProfilerError(
                f"--cpus {cpus} exceeds the {profile.meta.cpus} cores the profile was measured on"
            )
        return profile
    settings = ProfileSettings(precision=0.05, point_budget_s=point_budget_s, warmup=1)
    if save_to is not None:
        output = save_to
        result = run_profile(
            spec=spec,
            cpus=cpus,
            max_batch=max(batches),
            output=output,
            extra_batches=batches,
            settings=settings,
            stream=stream,
        )
    else:
        with tempfile.TemporaryDirectory(prefix="packrat-bench-") as tmp:
            result = run_profile(
                spec=spec,
                cpus=cpus,
                max_batch=max(batches),
                output=Path(tmp) / "profile.json",
                extra_batches=batches,
                settings=settings,
                stream=stream,
            )
    if result.profile is None:
        raise ProfilerError("the quick profile measured no point")
    return result.profile


def run_bench(
    *,
    spec: str,
    cpus: int,
    batches: Sequence[int],
    profile: Profile,
    repeats: int = 10,
    warmup: int = 2,
    pause_s: float = 0.05,
    allowed: Sequence[int] | None = None,
    stream: TextIO | None = None,
    run_timeout_s: float = 600.0,
    names: Sequence[str] = CONFIG_NAMES,
    handler: HandlerTarget | None = None,
    source: WorkerSource | None = None,
    others: Mapping[str, Profile] | None = None,
) -> list[BatchResult]:
    """Measure plan, fat and per-core side by side, interleaved, for every batch size
    (``names``: a subset of the configurations; ``handler``: run an archive's handler;
    ``source``: where the workers come from, default forked from one process with the model
    built; a given source is left open; ``others``: more profiles whose plans run in the same
    interleaving, as configurations ``plan-<name>``, e.g. an alone profile beside a
    co-located one)."""
    if repeats < 1:
        raise ProfilerError(f"--repeats must be >= 1, got {repeats}")
    base = profile_cpus(cpus, allowed=allowed)
    plans, extra_plans = _plans(profile, others, cpus=cpus, batches=batches)
    table = profile.table()
    own = source is None
    source = source or worker_source("forked", spec, handler)
    pool = WorkerPool(spec, handler=handler, source=source)
    pool.add_engines(profile, kind=source.kind)
    results: list[BatchResult] = []
    try:
        for plan in plans:
            configs = _configs(plan, table, names=names, extra_plans=extra_plans)
            runs, out = _start_configs(configs, pool, base)
            for _ in range(warmup):
                for config in configs:
                    run_once(*runs[config.name], timeout=run_timeout_s)
                    time.sleep(pause_s)
            running = [c.name for c in configs]
            for r in range(repeats):
                order = running[r % len(running) :] + running[: r % len(running)]
                for name in order:
                    out[name].samples_ms.append(run_once(*runs[name], timeout=run_timeout_s))
                    time.sleep(pause_s)  # let the previous configuration's threads go idle
                if stream is not None:
                    stream.write(
                        f"bench B={plan.batch}: repetition {r + 1}/{repeats} "
                        + " ".join(f"{n}={out[n].samples_ms[-1]:.1f}ms" for n in running)
                        + "\n"
                    )
                    stream.flush()
            results.append(BatchResult(batch=plan.batch, plan=plan, configs=out))
        pool.close()
    except BaseException:
        pool.kill()
        raise
    finally:
        if own:
            source.close()
    return results


def _plans(
    profile: Profile,
    others: Mapping[str, Profile] | None,
    *,
    cpus: int,
    batches: Sequence[int],
) -> tuple[list[Plan], dict[str, Optimizer]]:
    """The plan for every batch size, and an optimizer for each other profile."""
    try:
        # the plans the operator serves: a batch on a larger batch's faster plan when there is
        # one (plan/padding.py)
        horizon = padding_horizon(max(batches))
        optimizer = Optimizer.for_profile(profile, cpus=cpus, max_batch=horizon)
        plans = [PaddedPlans(optimizer).plan(b) for b in batches]
        extra_plans = {
            name: Optimizer.for_profile(other, cpus=cpus, max_batch=max(batches))
            for name, other in (others or {}).items()
        }
    except PlanError as exc:
        raise ProfilerError(str(exc)) from None
    return plans, extra_plans


def _configs(
    plan: Plan,
    table: dict[tuple[int, int], float],
    *,
    names: Sequence[str],
    extra_plans: Mapping[str, Optimizer],
) -> list[BenchConfig]:
    """The configurations run at ``plan``'s batch: those named, then the other profiles'."""
    configs = [c for c in bench_configs(plan, table) if c.name in names]
    for name, other in extra_plans.items():
        theirs = other.plan(plan.batch)
        configs.append(
            BenchConfig(f"plan-{name}", tuple(theirs.expand()), theirs.expected_latency_ms)
        )
    return configs


def _start_configs(
    configs: Sequence[BenchConfig], pool: WorkerPool, base: list[int]
) -> tuple[dict[str, tuple[list[Worker], list[int]]], dict[str, ConfigResult]]:
    """Each configuration's pinned workers (the fat instance may span sockets) and batches,
    and its empty result."""
    runs: dict[str, tuple[list[Worker], list[int]]] = {}
    out: dict[str, ConfigResult] = {}
    for config in configs:
        threads = [t for t, _ in config.instances]
        try:
            cores = assign_cores(threads, cpus=base)
        except CoreAssignmentError:
            if config.name != "fat":
                raise
            cores = assign_cores(threads, cpus=base, span_sockets=True)
        workers = pool.get_all(
            [(t, c) for (t, _), c in zip(config.instances, cores, strict=True)],
            engine=config.engine,
        )
        runs[config.name] = (workers, [b for _, b in config.instances])
        out[config.name] = ConfigResult(config, cores)
    return runs, out


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.1f}"


def _spread(result: ConfigResult) -> str:
    s = result.summary
    return f"{_ms(s.p50)} [{_ms(s.p25)}-{_ms(s.p75)}]"


def format_bench_table(results: Sequence[BatchResult]) -> str:
    """One row per batch: measured medians with IQR, speedups measured vs expected."""
    header = (
        "B",
        "plan",
        "plan ms [IQR]",
        "fat ms [IQR]",
        "per-core ms [IQR]",
        "speedup",
        "expected",
        "actual/exp",
        "per-core speedup",
    )
    rows = [header]
    for r in results:
        expected = r.expected_speedup
        ratio = r.actual_over_expected
        rows.append(
            (
                str(r.batch),
                r.plan.label,
                _spread(r.configs["plan"]),
                _spread(r.configs["fat"]),
                _spread(r.configs["per_core"]) + f" ({r.configs['per_core'].config.label})",
                f"{r.measured_speedup:.2f}x",
                "-" if expected is None else f"{expected:.2f}x",
                "-" if ratio is None else f"{ratio:.2f}",
                "-" if r.per_core_speedup is None else f"{r.per_core_speedup:.2f}x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )
