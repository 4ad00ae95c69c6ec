"""``packrat simulate``: one configuration on one trace, through the planner's own DES.

Pure (no torch): reads a profile and an arrival trace (a CSV of timestamps, or a synthetic
gamma trace from ``--rate``, ``--cv``, ``--seconds``, ``--seed``), simulates ``--replicas``
replicas of ``--cpus-per-replica`` cores each running Packrat's plan for ``--batch`` (or the
per-core plan, or the ``--plan`` given) and prints P50, P99, P99.9, the mean, utilisation and
the share of shed queries. The way to check a plan from ``packrat provision`` on traffic it
was not made on. Exit status 0, or 1 when ``--slo-p99-ms`` is given and missed; 2 for bad
input.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from packrat.cli import CliError, add_command, check_numbers
from packrat.cli.heartbeat import heartbeat
from packrat.cli.plan import add_profile_arg
from packrat.cli.provision import add_trace_args, check_common_numbers, load_inputs
from packrat.plan.des import SPREADS, SimulationError
from packrat.plan.optimizer import MAX_PLAN_BATCH, Optimizer, Plan, PlanError
from packrat.plan.provision import SHAPES, SimSettings
from packrat.plan.simulation import Summary, simulate_config
from packrat.plan.traces import gamma_trace, load_trace
from packrat.runtime.documents import DocumentError, read_capped_text

LABEL = re.compile(r"^(\d+)x(\d+)t/b(\d+)$")
MAX_PLAN_BYTES = 1024 * 1024
# the DES keeps a queue per replica: a billion replicas ran for minutes (issue 38); no
# cluster serves one model from more than this
MAX_SIM_REPLICAS = 10_000


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "simulate",
        run,
        help="simulate one configuration on a trace (P50, P99, utilisation, sheds)",
        description=(
            "Replay a trace (or a synthetic gamma process) against replicas x cores per "
            "replica x batch through the planner's discrete-event simulation, to check a "
            "configuration on traffic it was not planned on."
        ),
    )
    add_profile_arg(parser)
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--cpus-per-replica", type=int, help="cores per replica")
    parser.add_argument("--batch", type=int, help="serving batch per replica")
    parser.add_argument(
        "--plan",
        help="the plan per replica: a label (4x1t/b2+1x4t/b8) or a plan JSON file "
        "(packrat plan --format json); default: Packrat's plan for the cores and batch",
    )
    parser.add_argument("--plan-shape", choices=SHAPES, default="packrat")
    add_trace_args(parser, length_flag="--seconds", length_help="synthetic trace length")
    parser.add_argument("--max-batch-delay-ms", type=float, default=5.0)
    parser.add_argument("--spread", choices=SPREADS, default="random", help="Service spreading")
    parser.add_argument("--service-cv", type=float, default=0.0, help="per-batch time spread")
    parser.add_argument("--slo-p99-ms", type=float, help="report misses (exit 1 when missed)")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def _check(args: argparse.Namespace) -> None:
    check_numbers(args, "replicas", "cpus_per_replica", "batch", at_least=1)
    if args.plan is None and (args.cpus_per_replica is None or args.batch is None):
        raise CliError("give --cpus-per-replica and --batch, or --plan")
    if args.rate is not None:
        check_numbers(args, "rate", "cv", "seconds", above=0)
    check_numbers(args, "service_cv", at_least=0)
    check_numbers(args, "replicas", at_most=MAX_SIM_REPLICAS)
    # as a served plan's batch: --batch 1e9 asked the optimizer for a 127 GiB table
    check_numbers(args, "batch", at_most=MAX_PLAN_BATCH)
    check_common_numbers(args)
    check_numbers(args, "slo_p99_ms", above=0)


def parse_plan(text: str) -> list[tuple[int, int]]:
    """Instances from a label (``4x1t/b2+1x4t/b8``) or a plan JSON file's path."""
    if LABEL.match(text.split("+", maxsplit=1)[0].strip()):
        out: list[tuple[int, int]] = []
        for part in text.split("+"):
            m = LABEL.match(part.strip())
            if m is None:
                raise CliError(f"--plan: {part.strip()!r} is not COUNTxTHREADSt/bBATCH")
            count, threads, batch = (int(g) for g in m.groups())
            if min(count, threads, batch) < 1 or count > 4096:
                raise CliError(f"--plan: {part.strip()!r} needs counts, threads, batches >= 1")
            out.extend([(threads, batch)] * count)
        return out
    path = Path(text)
    try:
        doc = json.loads(read_capped_text(path, MAX_PLAN_BYTES))
        plan = Plan.from_dict(doc.get("plan", doc) if isinstance(doc, dict) else doc)
    except DocumentError as exc:
        raise CliError(f"--plan {path}: {exc}") from None
    except ValueError as exc:
        raise CliError(f"--plan {path}: not a plan: {exc}") from None
    return plan.expand()


def instances_from_args(
    args: argparse.Namespace, table: dict[tuple[int, int], float]
) -> list[tuple[int, int]]:
    if args.plan is not None:
        instances = parse_plan(args.plan)
        missing = sorted({p for p in instances if p not in table})
        if missing:
            raise CliError(f"--plan: instance (threads, batch) {missing[0]} is not in the profile")
        threads = sum(t for t, _ in instances)
        if args.cpus_per_replica is not None and threads > args.cpus_per_replica:
            raise CliError(
                f"--plan uses {threads} threads, more than --cpus-per-replica "
                f"{args.cpus_per_replica}"
            )
        return instances
    shaped = (
        table if args.plan_shape == "packrat" else {k: v for k, v in table.items() if k[0] == 1}
    )
    try:
        opt = Optimizer(
            shaped, cpus=args.cpus_per_replica, max_batch=args.batch, alternatives=False
        )
        return opt.plan(args.batch).expand()
    except PlanError as exc:
        raise CliError(str(exc)) from None


def _trace(args: argparse.Namespace) -> np.ndarray:
    """``--trace FILE``, else the synthetic gamma trace of ``--rate``, ``--cv``, ``--seconds``."""
    if args.trace is not None:
        return load_trace(args.trace)
    return gamma_trace(args.rate, cv=args.cv, duration_s=args.seconds, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    _check(args)
    profile, trace = load_inputs(
        args, _trace, cores_flag="--cpus-per-replica", cores=args.cpus_per_replica
    )
    table = dict(profile.table())
    instances = instances_from_args(args, table)
    sim = SimSettings(
        spread=args.spread, max_batch_delay_ms=args.max_batch_delay_ms, seed=args.seed
    )
    try:
        with heartbeat(
            lambda: (
                f"simulate: {trace.size} arrivals on {args.replicas} replica(s) of "
                f"{len(instances)} instance(s)"
            )
        ):
            summary = simulate_config(
                table,
                trace,
                instances,
                replicas=args.replicas,
                sim=sim,
                slo_ms=args.slo_p99_ms,
                service_cv=args.service_cv,
            )
    except SimulationError as exc:
        raise CliError(str(exc)) from None
    doc = {**summary.to_dict(), "replicas": args.replicas, "instances": instances}
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(summary, args.replicas, instances))
    return 1 if summary.meets_slo is False else 0


def _ms(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "inf (shed)"


def format_table(s: Summary, replicas: int, instances: list[tuple[int, int]]) -> str:
    plan = "+".join(f"{t}t/b{b}" for t, b in instances)
    lines = [
        f"{replicas} replicas x [{plan}]: {s.queries} queries, mean {s.mean_rate:.1f}/s, "
        f"sustained {s.sustained_rate:.1f}/s",
        f"P50 {_ms(s.p50_ms)} ms, P99 {_ms(s.p99_ms)} ms, P99.9 {_ms(s.p999_ms)} ms, "
        f"mean {_ms(s.mean_ms)} ms",
        f"utilization {s.utilization:.3f} (capacity {s.capacity_per_replica:.1f}/s per "
        f"replica), shed {s.shed} ({100 * s.shed_rate:.2f}%)",
    ]
    if s.slo_ms is not None:
        verdict = "met" if s.meets_slo else "MISSED"
        over = 100 * (s.slo_miss_rate or 0.0)
        lines.append(f"SLO P99 {s.slo_ms:g} ms: {verdict} ({over:.2f}% of queries over)")
    return "\n".join(lines)
