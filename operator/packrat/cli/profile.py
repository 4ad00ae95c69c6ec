"""``packrat profile``: measure a model's latency profile L(t, b) on this machine's cores.

The profiling pod's command and the laptop command are the same: it measures every grid point
in a fresh pinned worker process, shows progress with an ETA on stderr, checkpoints the JSON
profile after every point (rerunning with the same ``-o`` resumes) and prints the table.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from packrat.cli import CliError
from packrat.cli.plan import parse_int_list


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure a model's latency profile on pinned cores",
        description=(
            "Measure L(t, b), the mean latency of one batch b by one instance with t threads "
            "pinned to t cores, for t in 1..T (or --threads) and b in powers of two up to "
            "--max-batch. Each point runs alone in a fresh process; the output file is "
            "checkpointed after every point and a rerun resumes."
        ),
    )
    parser.add_argument("--model", required=True, help="zoo name or TorchScript file")
    parser.add_argument("--cpus", type=int, required=True, help="T: cores per replica")
    parser.add_argument("--max-batch", type=int, default=32, help="largest batch (default 32)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--threads", help="thread counts to profile, e.g. 1,2,4 (default 1..T)")
    parser.add_argument(
        "--precision",
        type=float,
        default=0.02,
        help="target 95%% CI half-width relative to the mean (default 0.02)",
    )
    parser.add_argument(
        "--point-budget",
        type=float,
        default=20.0,
        metavar="S",
        help="seconds per point, warm-up included (default 20)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        metavar="S",
        help="seconds for the whole run; stops cleanly with what was measured",
    )
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches per point")
    parser.add_argument("--min-samples", type=int, default=5, help="samples before stopping")
    parser.set_defaults(func=run)


def format_profile_table(profile: Any) -> str:
    """Latency grid: one row per batch, one column per thread count (ms)."""
    threads = profile.threads
    rows = [["batch", *(f"t={t} ms" for t in threads)]]
    for b in profile.batches:
        cells = [str(b)]
        for t in threads:
            value = profile.latency(t, b)
            cells.append("-" if value is None else f"{value:.4f}" if value < 1 else f"{value:.2f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the running worker is killed, checkpoint kept


def run(args: argparse.Namespace) -> int:
    from packrat.profiler.profiler import ProfilerError, ProfileSettings, run_profile

    threads = parse_int_list(args.threads, what="--threads") if args.threads else None
    settings = ProfileSettings(
        precision=args.precision,
        point_budget_s=args.point_budget,
        time_budget_s=args.time_budget,
        warmup=args.warmup,
        min_samples=args.min_samples,
    )
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run_profile(
            spec=args.model,
            cpus=args.cpus,
            max_batch=args.max_batch,
            output=args.output,
            threads=threads,
            settings=settings,
        )
    except ProfilerError as exc:
        raise CliError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.profile is not None:
        print(format_profile_table(result.profile))
    print(
        f"wrote {args.output}: {len(result.measured)} measured, {len(result.kept)} kept, "
        f"{len(result.missing)} missing ({result.stopped}) in {result.elapsed_s:.1f} s",
        file=sys.stderr,
    )
    return 0
