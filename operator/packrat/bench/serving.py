"""``packrat bench --serving``: does the Packrat plan beat what a TorchServe user would run?

For each batch size B it serves the model four ways on the same cores, with the same load
(closed-loop bursts of B requests; batch latency = until the last answer):

- ``packrat``: the optimizer's plan through ``packrat serve`` (pinned thin instances behind
  the dispatcher, on the runtime ``--runtime`` names: native or torchserve);
- ``fat``: one instance, T threads, batch B, through the same ``packrat serve`` path;
- ``torchserve``: TorchServe out of the box, as a user would run it: one registration with
  batch size B, TorchServe's default worker count, no thread settings, no pinning, queried
  directly (no dispatcher);
- ``per_core``: one 1-thread instance per core through ``packrat serve``.

``fat`` and ``per_core`` are :mod:`packrat.plan.baselines`, the same ones ``packrat bench``
measures on raw workers.

The configurations are interleaved (every repetition runs each once, in a rotated order),
because these machines are shared and noisy; the report gives the median over repetitions
of each run's median batch latency, the spread (min..max), the measured speedup of the plan
over each alternative and the optimizer's expected speedup.

Every run records at least :data:`MIN_BURSTS` bursts (after one warm-up burst), so each
run's median is a median of several batches at every B, not one sample.

It needs a profile to plan from: ``--profile FILE``, or a quick one measured first by the
profiler (:func:`packrat.bench.microbench.ensure_profile`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packrat.bench.loadgen import BurstResult, Target, run_bursts
from packrat.bench.servers import BenchError, Launch, PackratServe, PlainTorchServe
from packrat.bench.serving_report import (
    CONFIGS,
    MIN_BURSTS,
    PACKRAT,
    TORCHSERVE,
    BenchResult,
    Run,
    format_table,
)
from packrat.plan.baselines import BASELINES, PER_CORE, baseline_plan, expected_latency
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.padding import PaddedPlans, padding_horizon
from packrat.plan.profile import Profile, ProfileError, load_profile

log = logging.getLogger(__name__)

__all__ = [
    "CONFIGS",
    "MIN_BURSTS",
    "BenchError",
    "BenchResult",
    "BenchSettings",
    "Run",
    "bench",
    "config_plans",
    "format_table",
    "run_serving_bench",
]


@dataclass
class BenchSettings:
    """What :func:`run_serving_bench` reads from the command line."""

    model: str
    batches: list[int]
    cpus: int | None = None
    repeats: int = 3
    requests: int = 64  # requests per run: bursts = max(MIN_BURSTS, requests // B), recorded
    point_budget_s: float | None = None  # seconds per profile point when profiling here
    save_profile: Path | None = None
    json_output: bool = False
    profile: Path | None = None
    max_batch_delay_ms: int = 5
    output: Path | None = None  # JSON results
    workdir: Path | None = None
    profile_budget_s: float = 300.0
    startup_timeout_s: float = 300.0
    configs: tuple[str, ...] = CONFIGS
    runtime: str | None = None  # packrat serve --runtime (None: its default)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchSettings:
        batch = getattr(args, "batch", "4,8,16,32")
        if isinstance(batch, str):
            batches = [int(b) for b in batch.split(",") if b.strip()]
        else:
            batches = [int(b) for b in batch]
        requests = getattr(args, "requests", None)
        repeats = getattr(args, "repeats", None)
        configs = getattr(args, "configs", None)
        return cls(
            model=str(args.model),
            batches=batches,
            cpus=getattr(args, "cpus", None),
            repeats=int(repeats) if repeats else 3,
            requests=int(requests) if requests else 64,
            profile=getattr(args, "profile", None),
            max_batch_delay_ms=int(getattr(args, "max_batch_delay_ms", None) or 5),
            output=getattr(args, "output", None) or getattr(args, "json", None),
            workdir=getattr(args, "workdir", None),
            configs=tuple(configs.split(",")) if isinstance(configs, str) else CONFIGS,
            point_budget_s=getattr(args, "profile_budget", None),
            save_profile=getattr(args, "save_profile", None),
            json_output=getattr(args, "format", "table") == "json",
            runtime=getattr(args, "runtime", None),
        )

    def bursts(self, batch: int) -> int:
        """Recorded bursts of ``batch`` requests per run: about ``requests`` requests, and at
        least :data:`MIN_BURSTS` (``--requests 32`` at B=32 was one burst: a one-sample median)."""
        return max(MIN_BURSTS, self.requests // batch)


# -- the configurations ----------------------------------------------------------------------
def config_plans(plan: Plan, table: Mapping[tuple[int, int], float]) -> dict[str, Plan | None]:
    """What each configuration serves for ``plan.batch``: the plan, the two baselines (from
    :mod:`packrat.plan.baselines`) and TorchServe's own default (no plan)."""
    out: dict[str, Plan | None] = {PACKRAT: plan, TORCHSERVE: None}
    for name in BASELINES:
        out[name] = baseline_plan(name, cpus=plan.cpus, batch=plan.batch, table=table)
    return out


def _describe(plan: Plan | None, config: str, batch: int) -> str:
    if config == TORCHSERVE:
        return f"ts-default/b{batch}"
    return plan.label if plan else "?"


async def served_bursts(
    server: PackratServe | PlainTorchServe, *, body: bytes, batch: int, bursts: int
) -> BurstResult:
    """Start ``server``, send ``bursts`` closed-loop bursts of ``batch`` requests (after one
    warm-up burst), stop it."""
    try:
        await server.start()
        target = Target(url=server.url, model=server.model, body=body, timeout_s=600)
        return await run_bursts(target, burst=batch, bursts=bursts, warmup_bursts=1)
    finally:
        await server.stop()


async def _measure(
    *,
    settings: BenchSettings,
    config: str,
    plan: Plan | None,
    batch: int,
    cpus: Sequence[int],
    workdir: Path,
    body: bytes,
) -> tuple[list[float], int]:
    server: PackratServe | PlainTorchServe
    launch = Launch(
        model=settings.model,
        cpus=cpus,
        workdir=workdir,
        max_batch_delay_ms=settings.max_batch_delay_ms,
        startup_timeout_s=settings.startup_timeout_s,
    )
    if config == TORCHSERVE:
        server = PlainTorchServe(launch, batch=batch)
    else:
        assert plan is not None
        server = PackratServe(launch, plan=plan, runtime=settings.runtime)
    result = await served_bursts(server, body=body, batch=batch, bursts=settings.bursts(batch))
    return [v * 1000 for v in result.batch_latencies_s], result.errors


def obtain_profile(settings: BenchSettings, *, cpus: int) -> Profile:
    """The given profile, checked against the model and T, or a quick one measured now by the
    profiler itself (in this process's threads, no ``packrat profile`` subprocess)."""
    from packrat.bench.microbench import ensure_profile

    given = load_profile(settings.profile) if settings.profile is not None else None
    return ensure_profile(
        spec=settings.model,
        cpus=cpus,
        batches=settings.batches,
        profile=given,
        save_to=settings.save_profile,
        point_budget_s=settings.point_budget_s or 5.0,
        stream=sys.stderr,
    )


async def bench(settings: BenchSettings) -> BenchResult:
    """Run the benchmark; its work files go to ``settings.workdir`` or a removed temp dir."""
    if settings.workdir is not None:
        return await _bench(settings, settings.workdir)
    with tempfile.TemporaryDirectory(prefix="packrat-bench-") as tmp:
        return await _bench(settings, Path(tmp))


def _bench_cpus(settings: BenchSettings) -> tuple[int, list[int]]:
    """T (``--cpus``, else all of this process's cpus) and the first T of them."""
    from packrat.runtime.cpus import allowed_cpus

    available = allowed_cpus()
    t = settings.cpus or len(available)
    if t > len(available):
        raise BenchError(f"--cpus {t} but only {len(available)} cpus are available")
    return t, available[:t]


def _config_plans(
    settings: BenchSettings, optimizer: Optimizer, result: BenchResult
) -> dict[int, dict[str, Plan | None]]:
    """Every configuration's plan per batch size; each batch's optimal plan, with its
    expected speedup over one instance per core, goes into ``result.plans``."""
    plans: dict[int, dict[str, Plan | None]] = {}
    padded = PaddedPlans(optimizer)  # served as the operator serves it (plan/padding.py)
    for b in settings.batches:
        plan = padded.plan(b)
        plans[b] = config_plans(plan, optimizer.table)
        per_core_plan = plans[b][PER_CORE]
        assert per_core_plan is not None
        per_core_expected = expected_latency(tuple(per_core_plan.expand()), optimizer.table)
        doc = plan.to_dict()
        if per_core_expected is not None:
            doc["expected_speedup_per_core"] = per_core_expected / plan.expected_latency_ms
        result.plans[b] = doc
    return plans


async def _bench(settings: BenchSettings, workdir: Path) -> BenchResult:
    from packrat.serve.codec import example_body

    task = asyncio.current_task()
    if task is not None:  # SIGTERM: stop the server being measured, then exit
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    t, cpus = _bench_cpus(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    profile = await asyncio.to_thread(obtain_profile, settings, cpus=t)
    optimizer = Optimizer.for_profile(
        profile, cpus=t, max_batch=padding_horizon(max(settings.batches))
    )
    body = await asyncio.to_thread(example_body, settings.model)
    result = BenchResult(
        settings={
            "model": settings.model,
            "batches": settings.batches,
            "repeats": settings.repeats,
            "requests": settings.requests,
            "max_batch_delay_ms": settings.max_batch_delay_ms,
            "profile": str(settings.profile) if settings.profile else "profiled now",
            "runtime": settings.runtime or "default",
        },
        cpus=cpus,
    )
    plans = _config_plans(settings, optimizer, result)
    configs = [c for c in CONFIGS if c in settings.configs]
    for repeat in range(settings.repeats):
        for b in settings.batches:
            shift = (repeat + settings.batches.index(b)) % len(configs)
            order = configs[shift:] + configs[:shift]
            for config in order:
                chosen = plans[b][config]
                label = _describe(chosen, config, b)
                log.info("repeat %d B=%d %s (%s)", repeat + 1, b, config, label)
                started = time.monotonic()
                latencies, errors = await _measure(
                    settings=settings,
                    config=config,
                    plan=chosen,
                    batch=b,
                    cpus=cpus,
                    workdir=workdir / f"r{repeat}-b{b}-{config}",
                    body=body,
                )
                run = Run(config, b, repeat, label, latencies, errors)
                result.runs.append(run)
                log.info(
                    "  median %.1f ms over %d bursts, %d errors (%.0f s)",
                    run.median_ms,
                    len(latencies),
                    errors,
                    time.monotonic() - started,
                )
    return result


def run_serving_bench(args: argparse.Namespace) -> int:
    """Entry point for ``packrat bench --serving``.

    Reads from ``args``: ``model``, ``batch`` ("4,8,16,32" or a list), ``cpus`` (T; default
    this process's cpuset size), ``repeats`` (3), ``requests`` (requests per run, 64: bursts
    of B, at least 2 recorded), ``profile`` (a profile file; else ``packrat profile`` runs
    first), ``profile_budget`` (seconds per profile point), ``save_profile``, ``format``
    (table|json), and optionally ``max_batch_delay_ms``, ``output`` (JSON results file with
    every run), ``workdir``, ``configs`` (comma-separated subset of the four). Returns 2 with a
    message on stderr when it cannot run, 1 when a request failed.
    """
    settings = BenchSettings.from_args(args)
    try:
        result = asyncio.run(bench(settings))
    except (BenchError, ProfileError, PlanError, OSError, RuntimeError) as exc:
        print(f"packrat bench --serving: error: {exc}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:
        print("packrat bench --serving: interrupted", file=sys.stderr)
        return 130
    summary = result.summary()
    print(json.dumps(summary, indent=2) if settings.json_output else format_table(summary))
    if settings.output is not None:
        settings.output.parent.mkdir(parents=True, exist_ok=True)
        runs = [
            {
                "config": r.config,
                "batch": r.batch,
                "repeat": r.repeat,
                "label": r.label,
                "batch_latencies_ms": r.batch_latencies_ms,
                "errors": r.errors,
            }
            for r in result.runs
        ]
        settings.output.write_text(json.dumps({**summary, "runs": runs}, indent=2))
    return 0 if all(r.errors == 0 for r in result.runs) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m packrat.bench.serving``: the same benchmark without the bench CLI."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", default="4,8,16,32")
    parser.add_argument("--cpus", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64, help="requests per run")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--max-batch-delay-ms", type=int, default=5)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return run_serving_bench(parser.parse_args(argv))
    return 130


if __name__ == "__main__":
    sys.exit(main())
