"""``packrat profile``: measure a model's latency profile L(t, b) on this machine's cores.

The profiling pod's command and the laptop command are the same: it measures every grid point
with pinned workers forked from one process that built the model (co-located by default: as
many instances as fit on the T cores, all timed), shows progress with an ETA on stderr,
checkpoints the JSON profile after every point (rerunning with the same ``-o`` resumes) and
prints the table.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from packrat.cli import (
    CliError,
    add_command,
    add_model_arg,
    add_sample_request_args,
    check_model_file,
    make_folder,
    sample_request_file,
)
from packrat.cli.plan import parse_int_list
from packrat.plan.profile import COLOCATED, MODES


def register(subparsers: Any) -> None:
    add_command(
        subparsers,
        "profile",
        run,
        help="measure a model's latency profile on pinned cores",
        description=(
            "Measure L(t, b), the mean latency of one batch b by one instance with t threads "
            "pinned to t cores, for t in 1..T (or --threads) and b in powers of two up to "
            "--max-batch. By default each point runs floor(T/t) identical instances together "
            "on disjoint cores, all timed (--mode co-located), in workers forked from one "
            "process that built the model; the output file is checkpointed after every point "
            "and a rerun resumes."
        ),
        groups=(
            _add_model_args,
            _add_grid_args,
            _add_budget_args,
            _add_instance_args,
            _add_sampling_args,
            _add_verify_args,
        ),
    )


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model and the sample request its handler is profiled with."""
    add_model_arg(
        parser, help="zoo name, model file (TorchScript, .pt2, .onnx) or TorchServe .mar archive"
    )
    add_sample_request_args(
        parser,
        help=(
            "a request body the model's handler accepts; batch b runs b copies of it through "
            "the handler the serving pod runs (required for a .mar; for a zoo model or "
            "TorchScript file it profiles through Packrat's native handler)"
        ),
    )


def _add_grid_args(parser: argparse.ArgumentParser) -> None:
    """The grid of points measured (cores, batches, thread counts) and the output file."""
    parser.add_argument("--cpus", type=int, required=True, help="T: cores per replica")
    parser.add_argument("--max-batch", type=int, default=32, help="largest batch (default 32)")
    parser.add_argument(
        "--engines",
        default="eager",
        help=(
            "engines to profile, comma-separated (eager, inductor, onnxruntime, openvino) or "
            "'all' installed; each is converted once, checked against eager and left out with "
            "its reason when it fails (default eager)"
        ),
    )
    parser.add_argument(
        "--missing-engines",
        choices=("fail", "leave-out"),
        default="fail",
        help="an engine in --engines whose extra is not installed: one line and exit 2 (fail, "
        "the default), or left out of the profile with its reason (leave-out, the operator's "
        "Job: the EnginesVerified condition and an event say it)",
    )
    parser.add_argument(
        "--artefacts",
        type=Path,
        help="folder of converted artefacts, reused across profiles and by the pods "
        "(default: artefacts/ beside -o)",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="profile JSON to write")
    parser.add_argument(
        "--threads", help="thread counts to profile, e.g. 1,2,4 (default: --thread-grid)"
    )
    parser.add_argument(
        "--thread-grid",
        choices=("auto", "full", "coarse", "refined"),
        default="auto",
        help=(
            "without --threads: full (1..T), coarse (powers of two and T), refined (coarse, "
            "then the midpoints around the thread counts the plans chose; its effect on the "
            "plans is recorded), or auto (default: full up to 8 cores, refined above)"
        ),
    )


def _add_budget_args(parser: argparse.ArgumentParser) -> None:
    """How precisely, and for how long, each point and the whole run are measured."""
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


def _add_instance_args(parser: argparse.ArgumentParser) -> None:
    """How the instances of a point run: co-located or alone, forked or fresh, remainder."""
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=COLOCATED,
        help=(
            "co-located (default): floor(T/t) instances run each point together, all timed, "
            "an untimed filler on the T mod t cores; alone: one instance, the other cores idle"
        ),
    )
    parser.add_argument(
        "--process",
        choices=("forked", "fresh"),
        default="forked",
        help=(
            "forked (default): workers forked from one process that imported torch and built "
            "the model; fresh: a new process (torch import, model build) per instance"
        ),
    )
    parser.add_argument(
        "--remainder",
        choices=("fill", "idle"),
        default="fill",
        help="co-located: keep the T mod t remainder cores busy (default) or idle",
    )


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Warm-up, minimum samples, and whether a contended profile is kept."""
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches per point")
    parser.add_argument("--min-samples", type=int, default=5, help="samples before stopping")
    parser.add_argument(
        "--allow-contended",
        action="store_true",
        default=None,
        help=(
            "store the profile even when its cores were not quiet or a monotonicity break "
            "survived re-measurement (it is recorded as contaminated); default: refuse, or "
            "PACKRAT_ALLOW_CONTENDED=1"
        ),
    )
    parser.add_argument(
        "--progress-records",
        choices=("auto", "on", "off"),
        default="auto",
        help=(
            "the machine-readable progress lines (packrat-progress {...}) after each progress "
            "line, for a log reader such as the operator: auto (default) = only when stderr "
            "is not a terminal"
        ),
    )


def _add_verify_args(parser: argparse.ArgumentParser) -> None:
    """The optional verification of the optimizer's plan against the fat instance."""
    parser.add_argument(
        "--verify-batches",
        metavar="LIST",
        help=(
            "after the profile, run the optimizer's plan against the fat instance for these "
            "batch sizes (e.g. 1,2,4), interleaved, and keep the measured speedups in the "
            "profile (meta.extra.verified); a failed verification keeps the profile"
        ),
    )
    parser.add_argument(
        "--verify-repeats", type=int, default=5, help="repetitions per verified batch (default 5)"
    )


def format_profile_table(profile: Any) -> str:
    """Latency grid: one row per batch, one column per thread count (ms); one grid per
    engine when several were profiled."""
    if len(profile.engines) > 1:
        return "\n".join(
            f"engine {e}:\n" + format_profile_table(profile.for_engine(e)) for e in profile.engines
        )
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


def handler_target(args: argparse.Namespace, workdir: Path) -> Any:
    """What to run per batch: None (the bare model) or an archive's handler + sample request."""
    from packrat.profiler.client import HandlerTarget
    from packrat.serve.torchserve.archive import ArchiveError, build_archive, is_mar

    sample = sample_request_file(args, workdir)
    if sample is None:
        if is_mar(args.model):
            raise CliError(
                f"{args.model}: a .mar is profiled through its own handler; give "
                "--sample-request FILE, a request body that handler accepts"
            )
        return None
    try:
        archive = build_archive(args.model, workdir=workdir / "archive")
    except ArchiveError as exc:
        raise CliError(str(exc)) from None
    return HandlerTarget(
        archive=archive.path, sample_request=sample, content_type=args.sample_content_type
    )


def _verify(
    args: argparse.Namespace, profile: Any, *, batches: list[int], handler: Any, source: Any
) -> None:
    """Measure the plans against the fat instance and keep the result in the profile."""
    from packrat.bench.verify import format_verification, verify_plans, with_verification

    record = verify_plans(
        profile,
        spec=args.model,
        cpus=args.cpus,
        batches=batches,
        repeats=args.verify_repeats,
        handler=handler,
        stream=sys.stderr,
        source=source,
    )
    with_verification(profile, record).save(args.output)
    print(format_verification(record), file=sys.stderr)


def _profile_grid(
    args: argparse.Namespace, threads: list[int] | None, settings: Any, *, handler: Any,
    source: Any,
) -> Any:  # fmt: skip
    """Profile the thread grid: the given threads, the full grid, or coarse then refined
    (a second run over the same file resumes: only the new thread counts are measured)."""
    from dataclasses import replace

    from packrat.plan.grid import FULL_GRID_UP_TO, coarse_threads, refine_threads
    from packrat.profiler.profiler import run_profile

    grid = args.thread_grid
    if grid == "auto":
        grid = "full" if args.cpus <= FULL_GRID_UP_TO else "refined"
    if threads is None and grid != "full":
        threads = coarse_threads(args.cpus)

    def once(ts: list[int] | None, budget: float | None) -> Any:
        return run_profile(
            spec=args.model,
            cpus=args.cpus,
            max_batch=args.max_batch,
            output=args.output,
            threads=ts,
            settings=replace(settings, time_budget_s=budget),
            handler=handler,
            source=source,
            engines=args.engines,
            artefacts=args.artefacts,
        )

    result = once(threads, settings.time_budget_s)
    if args.threads or grid != "refined" or result.missing or result.profile is None:
        return result
    coarse = result.profile
    batches = coarse.batches
    extra = refine_threads(coarse.table(), cpus=args.cpus, batches=batches)
    if not extra:
        return result
    left = None
    if settings.time_budget_s is not None:
        left = max(settings.time_budget_s - result.elapsed_s, 1.0)
    refined = once(sorted({*(threads or []), *extra}), left)
    if refined.profile is not None and not refined.missing:
        refined.profile = _record_refinement(
            args.output,
            coarse,
            refined.profile,
            cpus=args.cpus,
            coarse_threads=threads,
            extra=extra,
        )
    refined.measured = [*result.measured, *refined.measured]
    refined.startup_s += result.startup_s
    refined.elapsed_s += result.elapsed_s
    return refined


def _record_refinement(
    output: Path,
    coarse: Any,
    refined: Any,
    *,
    cpus: int,
    coarse_threads: list[int] | None,
    extra: list[int],
) -> Any:
    """The refined profile with ``meta.extra.thread_grid`` (the coarse and added thread
    counts, and per batch how much slower the coarse grid's best plan was), saved."""
    from dataclasses import replace

    from packrat.plan.optimizer import Optimizer, PlanError

    batches = coarse.batches
    try:
        before = Optimizer.for_profile(coarse, cpus=cpus, max_batch=max(batches))
        after = Optimizer.for_profile(refined, cpus=cpus, max_batch=max(batches))
        gain = {
            str(b): round(before.latency(b) / after.latency(b) - 1.0, 4)
            for b in batches
            if before.feasible(b) and after.feasible(b)
        }
    except PlanError:
        gain = {}
    info = {
        "coarse": coarse_threads,
        "refined": extra,
        # per batch: how much slower the coarse grid's best plan was than the refined one's
        "coarse_plan_excess": gain,
    }
    meta = refined.meta
    profile = replace(refined, meta=replace(meta, extra={**meta.extra, "thread_grid": info}))
    profile.save(output)
    return profile


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="packrat-profile-") as tmp:
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, workdir: Path) -> int:
    from packrat.profiler.client import worker_source
    from packrat.profiler.profiler import ProfilerError, ProfileSettings
    from packrat.runtime.engines import EngineError, parse_engines

    try:
        args.engines = parse_engines(
            args.engines, allow_missing=args.missing_engines == "leave-out"
        )
    except EngineError as exc:
        raise CliError(f"--engines: {exc}") from None
    check_model_file(args.model, args.inputs)
    if args.artefacts is not None and any(e != "eager" for e in args.engines):
        make_folder(args.artefacts, "--artefacts")  # before any point is measured
    handler = handler_target(args, workdir)
    threads = parse_int_list(args.threads, what="--threads") if args.threads else None
    verify = (
        parse_int_list(args.verify_batches, what="--verify-batches") if args.verify_batches else []
    )
    if args.verify_repeats < 1:
        raise CliError(f"--verify-repeats must be >= 1, got {args.verify_repeats}")
    settings = ProfileSettings(
        precision=args.precision,
        point_budget_s=args.point_budget,
        time_budget_s=args.time_budget,
        warmup=args.warmup,
        min_samples=args.min_samples,
        mode=args.mode,
        process=args.process,
        fill_remainder=args.remainder == "fill",
        progress_records={"on": True, "off": False}.get(args.progress_records),
        **({"allow_contended": True} if args.allow_contended else {}),
    )
    source = worker_source(args.process, args.model, handler)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        result = _profile_grid(args, threads, settings, handler=handler, source=source)
        if verify and result.profile is not None and not result.missing:
            _verify(args, result.profile, batches=verify, handler=handler, source=source)
    except ProfilerError as exc:
        raise CliError(str(exc)) from None
    finally:
        source.close()
        signal.signal(signal.SIGTERM, previous)
    if result.profile is not None:
        print(format_profile_table(result.profile))
    print(
        f"wrote {args.output}: {len(result.measured)} measured, {len(result.kept)} kept, "
        f"{len(result.missing)} missing ({result.stopped}) in {result.elapsed_s:.1f} s, "
        f"worker start-up {result.startup_s:.1f} s",
        file=sys.stderr,
    )
    return 0
