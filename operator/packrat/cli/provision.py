"""``packrat provision``: replicas, replica size and batch for a P99 latency SLO, fewest cores.

Pure (no torch): reads a profile and an arrival trace (a CSV of timestamps, or a synthetic
gamma trace from ``--rate`` and ``--cv``), runs InferLine's planner over Packrat plans
(:mod:`packrat.plan.provision`) and prints the configuration with the coarse-grained
baselines. The answer runs at no more than ``--max-utilization`` of its capacity and is
validated on ``--resamples`` held-out resamples of the trace; a trace too short for the
SLO's tail gets a warning. Exit status 0 when the SLO is met, 1 when it cannot be (the output
then says why, and the cores or the SLO that would be feasible), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packrat.cli import CliError, add_command, check_numbers
from packrat.cli.heartbeat import Counter, heartbeat
from packrat.plan.des import SPREADS
from packrat.plan.profile import Profile, ProfileError, load_profile
from packrat.plan.provision import (
    Planner,
    Provision,
    ProvisionError,
    Robustness,
    SimSettings,
    provision,
)
from packrat.plan.traces import (
    MAX_ARRIVALS,
    MAX_TRACE_SPAN_S,
    TraceError,
    gamma_trace,
    load_trace,
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "provision",
        run,
        help="plan replicas, cores per replica and batch for a P99 latency SLO",
        description=(
            "Find the fewest total cores (replicas x cores per replica, each replica running "
            "Packrat's plan) whose simulated P99 latency on an arrival trace meets the SLO "
            "(InferLine's planner), and compare with fat replicas sized for the mean and the "
            "peak rate."
        ),
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--profile", type=Path, help="profile JSON or CSV (one model)")
    what.add_argument(
        "--pipeline", type=Path, help="pipeline YAML: stages, edges, SLO (see docs/pipelines.md)"
    )
    parser.add_argument(
        "--slo-p99-ms", type=float, help="P99 latency target (a pipeline file may give it)"
    )
    add_trace_args(parser)
    parser.add_argument("--max-cores", type=int, help="total cores allowed (default 64 x T)")
    parser.add_argument("--max-cpus", type=int, help="largest replica size (default: T)")
    parser.add_argument("--spread", choices=SPREADS, default="random", help="Service spreading")
    parser.add_argument("--max-batch-delay-ms", type=float, default=5.0)
    parser.add_argument(
        "--max-utilization",
        type=float,
        default=0.9,
        help="highest planned utilisation at the trace's sustained rate (default 0.9)",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=4,
        help="held-out resamples of the trace the answer must also meet the SLO on (default 4)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")


def _check(args: argparse.Namespace) -> None:
    if args.slo_p99_ms is None and args.pipeline is None:
        raise CliError("--slo-p99-ms is required with --profile")
    check_numbers(args, "slo_p99_ms", above=0)
    if args.rate is not None:
        check_numbers(args, "rate", "cv", "duration", above=0)
    check_numbers(args, "max_cores", "max_cpus", at_least=1)
    check_common_numbers(args)
    if not (math.isfinite(args.max_utilization) and 0 < args.max_utilization <= 1):
        raise CliError(f"--max-utilization must be in (0, 1], got {args.max_utilization}")
    if not 0 <= args.resamples <= 64:
        raise CliError(f"--resamples must be in [0, 64], got {args.resamples}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.pipeline is not None:
        from packrat.cli.pipeline_provision import run_pipeline

        return run_pipeline(args)
    profile, trace = load_inputs(
        args, trace_from_args, cores_flag="--max-cpus", cores=args.max_cpus
    )
    top = profile.meta.cpus or profile.max_threads
    done = Counter()
    try:
        with heartbeat(lambda: f"provision: {done.value} simulations of {trace.size} arrivals"):
            planner = Planner(
                profile.table(),
                trace,
                slo_ms=args.slo_p99_ms,
                max_cores=args.max_cores,
                max_cpus=min(args.max_cpus or top, top),
                sim=sim_from_args(args),
                robust=Robustness(max_utilization=args.max_utilization, resamples=args.resamples),
                on_simulation=done,
            )
            result = provision(planner, model=profile.meta.model)
    except ProvisionError as exc:
        raise CliError(str(exc)) from None
    return print_result(args, result, format_table(result))


# -- shared with packrat.cli.pipeline_provision and packrat.cli.simulate ------------------------
# as the CRD's maxBatchDelayMs: a longer wait is not a serving configuration (nan and inf were
# taken and simulated, issue 38)
MAX_BATCH_DELAY_MS = 10_000


def add_trace_args(
    parser: argparse.ArgumentParser,
    *,
    length_flag: str = "--duration",
    length_help: str = "synthetic trace length (s)",
) -> None:
    """The trace both planners (provision, simulate) run on: ``--trace FILE`` or a synthetic
    gamma process (``--rate``, ``--cv``, its length, ``--seed``)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="arrival times (s): one per line or a column")
    source.add_argument("--rate", type=float, help="synthetic gamma trace: mean arrivals/s")
    parser.add_argument("--cv", type=float, default=1.0, help="inter-arrival CV (default 1)")
    parser.add_argument(length_flag, type=float, default=60.0, help=length_help)
    parser.add_argument("--seed", type=int, default=0, help="trace and spreading seed")


def check_common_numbers(args: argparse.Namespace) -> None:
    """The trace and batching flags both planners share: a finite delay in [0, 10 s], a seed
    numpy accepts (a negative one was a traceback)."""
    check_numbers(args, "max_batch_delay_ms", at_least=0, at_most=MAX_BATCH_DELAY_MS)
    check_numbers(args, "seed", at_least=0, at_most=2**63 - 1)


def load_inputs(
    args: argparse.Namespace,
    trace_of: Callable[[argparse.Namespace], np.ndarray],
    *,
    cores_flag: str,
    cores: int | None,
) -> tuple[Profile, np.ndarray]:
    """``--profile`` and the trace ``trace_of`` makes from the flags (a bad file: one clear
    line), with ``cores`` (the value of ``cores_flag``) checked against the cores the
    profile was measured on (shared by provision and simulate)."""
    try:
        profile = load_profile(args.profile)
        trace = trace_of(args)
    except (ProfileError, TraceError) as exc:
        raise CliError(str(exc)) from None
    top = profile.meta.cpus or profile.max_threads
    if cores is not None and cores > top:
        raise CliError(f"{cores_flag} {cores} exceeds the {top} cores the profile was measured on")
    return profile, trace


def trace_from_args(args: argparse.Namespace) -> np.ndarray:
    """``--trace FILE``, else the synthetic gamma trace of ``--rate``, ``--cv``, ``--duration``."""
    if args.trace is not None:
        return load_trace(args.trace)
    if args.rate * args.duration > MAX_ARRIVALS:
        raise TraceError(
            f"--rate x --duration is {args.rate * args.duration:g} arrivals; at most {MAX_ARRIVALS}"
        )
    if args.duration > MAX_TRACE_SPAN_S:
        raise TraceError(f"--duration must be at most {MAX_TRACE_SPAN_S} s, got {args.duration:g}")
    return gamma_trace(args.rate, cv=args.cv, duration_s=args.duration, seed=args.seed)


def sim_from_args(args: argparse.Namespace) -> SimSettings:
    return SimSettings(
        spread=args.spread, max_batch_delay_ms=args.max_batch_delay_ms, seed=args.seed
    )


class _Result(Protocol):
    @property
    def feasible(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


def print_result(args: argparse.Namespace, result: _Result, table: str) -> int:
    """Print ``result`` as ``--format`` says (JSON, else ``table``); the exit status."""
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(table)
    return 0 if result.feasible else 1


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def trace_line(doc: dict[str, Any], slo: str = "SLO") -> str:
    """The table's first line: the trace's arrivals and rates, and the SLO."""
    t = doc["trace"]
    return (
        f"trace: {t['arrivals']} arrivals over {t['duration_s']:.1f} s, mean "
        f"{t['mean_rate']:.1f}/s, peak (1 s) {t['peak_rate_1s']:.1f}/s; "
        f"{slo} P99 {doc['slo_p99_ms']:.1f} ms"
    )


def infeasible_line(doc: dict[str, Any]) -> str:
    why = doc.get("infeasible")
    if why:
        return f"infeasible: {why['reason']}"
    p99 = doc["simulated_p99_ms"]
    best = "every configuration sheds queries" if p99 is None else f"the best P99 is {ms(p99)} ms"
    return f"infeasible: {best} > SLO {doc['slo_p99_ms']:.1f} ms"


def format_table(result: Provision) -> str:
    doc = result.to_dict()
    lines = [
        trace_line(doc),
        f"{'config':10}{'replicas':>9}{'cpus':>6}{'batch':>7}{'cores':>7}{'P99 ms':>10}"
        f"{'miss %':>8}{'util':>7}  feasible",
    ]
    rows = [("planned", doc)] + [(k, v) for k, v in doc["baselines"].items()]
    for name, row in rows:
        lines.append(
            f"{name:10}{row['replicas']:>9}{row['cpus_per_replica']:>6}{row['batch']:>7}"
            f"{row['cores']:>7}{ms(row['simulated_p99_ms']):>10}"
            f"{100 * row['slo_miss_rate']:>8.2f}{_util(row['utilization']):>7}"
            f"  {'yes' if row['feasible'] else 'NO'}"
        )
    shape = " (per-core)" if doc["plan_shape"] == "per_core" else ""
    lines.append(f"plan per replica: {doc['plan']['label']}{shape}")
    check = doc["validation"]
    if check and check["resamples"]:
        p99s = ", ".join(ms(p) for p in check["p99_ms"])
        added = f", {check['added_replicas']} replica(s) added" if check["added_replicas"] else ""
        verdict = "met" if check["passed"] else "NOT met"
        lines.append(f"held-out resamples: P99 {p99s} ms: SLO {verdict}{added}")
    lines.append(
        f"search: {doc['search']['evaluations']} simulations in {doc['search']['wall_s']:.2f} s"
    )
    if not doc["feasible"]:
        lines.append(infeasible_line(doc))
    lines.extend(f"warning: {w}" for w in doc["warnings"])
    return "\n".join(lines)


def _util(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
