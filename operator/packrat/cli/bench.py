"""``packrat bench``: Packrat's microbenchmark on this machine's cores, measured for real.

Thin: the measurement lives in :mod:`packrat.bench.microbench` (plan vs fat vs one-per-core,
interleaved) and, with ``--serving``, in :mod:`packrat.bench.serving` (the same comparison
through the serving stack).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from packrat.cli import CliError, add_command
from packrat.cli.plan import parse_int_list


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "bench",
        run,
        help="measure the plan against the fat instance and one instance per core",
        description=(
            "For each batch size, run the optimizer's plan (its instances concurrently, pinned "
            "to disjoint cores), the fat instance (T threads) and one 1-thread instance per "
            "core, interleaved over repetitions; print measured medians with their spread, "
            "measured speedup over fat, expected speedup and actual/expected."
        ),
    )
    parser.add_argument("--model", required=True, help="zoo name or TorchScript file")
    parser.add_argument("--cpus", type=int, required=True, help="T: cores per replica")
    parser.add_argument("--batch", required=True, help="batch size(s), e.g. 4,8,16,32")
    parser.add_argument(
        "--profile", type=Path, help="profile JSON/CSV (default: a quick profile is measured)"
    )
    parser.add_argument(
        "--save-profile", type=Path, help="where to keep the quick profile (default: discard)"
    )
    parser.add_argument(
        "--profile-budget",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds per point of the quick profile (default 5)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="interleaved repetitions (default 10; 3 with --serving)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="warm-up runs per configuration")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--json-out",
        dest="output",
        type=Path,
        help="also write the JSON result (with every sample) to this file, any --format",
    )
    parser.add_argument(
        "--serving",
        action="store_true",
        help="benchmark through the serving stack (packrat.bench.serving) instead",
    )
    serving = parser.add_argument_group("with --serving")
    serving.add_argument("--requests", type=int, help="requests per run (default 64)")
    serving.add_argument(
        "--max-batch-delay-ms", type=int, help="the dispatcher's batching delay (default 5)"
    )
    serving.add_argument("--workdir", type=Path, help="where the serving processes keep files")
    serving.add_argument("--configs", help="comma-separated subset of the configurations")
    serving.add_argument(
        "--runtime",
        choices=("native", "torchserve"),
        help="the runtime packrat serve runs the plans on (default: packrat serve's, native)",
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the worker processes are stopped


def run(args: argparse.Namespace) -> int:
    if args.serving:
        serve_bench = importlib.import_module("packrat.bench.serving")
        code: int = serve_bench.run_serving_bench(args)
        return code

    from packrat.bench.microbench import ensure_profile, format_bench_table, run_bench
    from packrat.plan.profile import ProfileError, load_profile
    from packrat.profiler.client import WorkerError
    from packrat.profiler.profiler import ProfilerError

    batches = parse_int_list(args.batch, what="--batch")
    repeats = 10 if args.repeats is None else args.repeats
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        given = load_profile(args.profile) if args.profile else None
        profile = ensure_profile(
            spec=args.model,
            cpus=args.cpus,
            batches=batches,
            profile=given,
            save_to=args.save_profile,
            point_budget_s=args.profile_budget,
            stream=sys.stderr,
        )
        results = run_bench(
            spec=args.model,
            cpus=args.cpus,
            batches=batches,
            profile=profile,
            repeats=repeats,
            warmup=args.warmup,
            stream=sys.stderr,
        )
    except (ProfileError, ProfilerError, WorkerError) as exc:
        raise CliError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    load = os.getloadavg()[0]
    payload = {
        "model": args.model,
        "cpus": args.cpus,
        "repeats": repeats,
        "profile": str(args.profile) if args.profile else None,
        "loadavg_1m_at_end": load,
        "results": [r.to_dict() for r in results],
    }
    if args.output:
        args.output.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if args.format == "json":
        print(json.dumps(payload, indent=2))
    else:
        print(
            f"{args.model} on {args.cpus} cores, {repeats} interleaved repetitions; "
            f"latency per batch, median [p25-p75]; 1-min load average at the end {load:.2f}"
        )
        print(format_bench_table(results))
    return 0
