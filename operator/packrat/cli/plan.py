"""``packrat plan``: the optimal thin-instance plan for a profile, T cores and batch sizes.

Pure and fast (no torch import): it reads a JSON profile or a ``threads,batch,latency_ms``
CSV, runs the exact optimizer once for the largest batch asked (one DP pass answers every
smaller batch too) and prints a table, JSON, and optionally a plot.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packrat.cli import CliError, add_command
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.padding import PaddedPlans, padding_horizon
from packrat.plan.profile import ENGINES_KEY, MAX_BATCH, Profile, ProfileError, load_profile

MAX_LIST = 1 << 16  # values in one --batch or --threads list (the largest batch is 65536)


def parse_int_list(text: str, *, what: str) -> list[int]:
    """``"4,8,16"`` -> ``[4, 8, 16]``; also accepts ranges such as ``1-8``."""
    values: list[int] = []
    try:
        for raw in text.split(","):
            part = raw.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi - lo >= MAX_LIST:  # 1-1000000000 was a billion integers in memory
                    raise CliError(f"{what}: the range {part} has more than {MAX_LIST} values")
                values.extend(range(lo, hi + 1))
            else:
                values.append(int(part))
    except ValueError:
        raise CliError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise CliError(f"{what} is empty")
    if len(values) > MAX_LIST:
        raise CliError(f"{what} has more than {MAX_LIST} values")
    bad = [v for v in values if v <= 0]
    if bad:
        raise CliError(f"{what} must be positive, got {bad[0]}")
    return values


def add_profile_arg(parser: argparse.ArgumentParser) -> None:
    """``--profile``, the latency profile a planning command reads (:func:`load_profile`)."""
    parser.add_argument("--profile", required=True, type=Path, help="profile JSON or CSV")


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "plan",
        run,
        help="compute the optimal thin-instance plan from a profile",
        description=(
            "Compute Packrat's optimal mix of instances <count, threads, batch> for T cores "
            "and batch B from a latency profile (JSON or threads,batch,latency_ms CSV)."
        ),
    )
    add_profile_arg(parser)
    parser.add_argument("--cpus", type=int, help="cores per replica T (default: the profile's)")
    parser.add_argument("--batch", required=True, help="batch size(s): 8 or 4,8,16 or 1-32")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--plot", type=Path, help="write expected latency vs batch size (PNG)")
    parser.add_argument(
        "--exact",
        action="store_true",
        help=(
            "instance batches sum to B exactly (default: a batch may run on a larger batch's "
            "faster plan with slots left idle, as the operator serves it)"
        ),
    )


def measured_cpus(profile: Profile) -> int:
    """The cores a profile speaks for: ``meta.cpus``, else the most threads it measured."""
    return profile.meta.cpus if profile.meta.cpus > 0 else profile.max_threads


def make_optimizer(profile: Profile, *, cpus: int, max_batch: int) -> Optimizer:
    limit = measured_cpus(profile)
    if cpus > limit:
        where = (
            "the profile was measured on"
            if profile.meta.cpus > 0
            else "the profile measured (it does not record meta.cpus)"
        )
        raise CliError(
            f"--cpus {cpus} exceeds the {limit} cores {where}; "
            "profile on the target cores instead of extrapolating"
        )
    if max_batch > MAX_BATCH:
        raise CliError(f"--batch {max_batch} is larger than {MAX_BATCH}")
    try:
        return Optimizer.for_profile(profile, cpus=cpus, max_batch=max_batch)
    except PlanError as exc:
        raise CliError(str(exc)) from None


def engine_notes(profile: Profile) -> list[str]:
    """One line per engine the profile left out (it failed to convert or disagreed with eager)."""
    engines = profile.meta.extra.get(ENGINES_KEY)
    if not isinstance(engines, dict):
        return []
    return [
        f"engine {name} left out: {str(record.get('reason', ''))[:200]}"
        for name, record in sorted(engines.items())
        if isinstance(record, dict) and record.get("status") == "excluded"
    ]


def fmt_ms(value: float | None) -> str:
    """Milliseconds with two decimals, or three significant digits below 1 ms."""
    if value is None:
        return "-"
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def format_table(plans: Sequence[Plan]) -> str:
    header = (
        "cpus",
        "batch",
        "plan",
        "instances",
        "expected ms",
        "fat ms",
        "per-core ms",
        "speedup",
        "holds",
    )
    rows = [header]
    for p in plans:
        per_core = next((a.latency_ms for a in p.alternatives if a.name == "per_core"), None)
        fat_engine = next(
            (
                a.name.removeprefix("fat_engine_")
                for a in p.alternatives
                if a.name.startswith("fat_engine_")
            ),
            None,
        )
        rows.append(
            (
                str(p.cpus),
                str(p.batch),
                p.label,
                str(p.num_instances),
                fmt_ms(p.expected_latency_ms),
                fmt_ms(p.fat_latency_ms) + (f" {fat_engine}" if fat_engine else ""),
                fmt_ms(per_core),
                "-" if p.expected_speedup is None else f"{p.expected_speedup:.2f}x",
                str(p.capacity) + ("*" if p.capacity > p.batch else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.extend(padding_note(p) for p in plans if p.capacity > p.batch)
    return "\n".join(lines)


def padding_note(plan: Plan) -> str:
    """One line for a padded plan: which batch's plan it runs and how many slots stay idle."""
    idle = plan.capacity - plan.batch
    return (
        f"* batch {plan.batch} runs on the plan for batch {plan.capacity} "
        f"({idle} slot{'s' if idle != 1 else ''} idle): faster than any plan for exactly "
        f"{plan.batch}"
    )


def plot_plans(
    curve: Sequence[Plan], path: Path, *, title: str, marked: Sequence[Plan] = ()
) -> None:
    """Expected latency of the plan and of the fat instance for every batch in ``curve``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(
        [p.batch for p in curve],
        [p.expected_latency_ms for p in curve],
        ".",
        markersize=3,
        label="Packrat plan (expected)",
    )
    fat = [(p.batch, p.fat_latency_ms) for p in curve if p.fat_latency_ms is not None]
    if fat:
        ax.plot([b for b, _ in fat], [v for _, v in fat], "s--", label="fat instance (profiled)")
    for p in marked:
        ax.plot([p.batch], [p.expected_latency_ms], "o", color="black")
        ax.annotate(
            p.label,
            (p.batch, p.expected_latency_ms),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, -10),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("latency per batch (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_writable(path: Path) -> None:
    """Refuse an output path whose folder is missing before any work is done."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"--plot {path}: folder {parent} does not exist")
    if path.is_dir():
        raise CliError(f"--plot {path}: is a folder")


def run(args: argparse.Namespace) -> int:
    if args.plot:
        check_writable(args.plot)
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        raise CliError(str(exc)) from None
    cpus = args.cpus if args.cpus is not None else profile.meta.cpus
    if cpus is None or cpus <= 0:
        raise CliError("--cpus must be a positive integer")
    batches = parse_int_list(args.batch, what="--batch")
    if max(batches) > MAX_BATCH:
        raise CliError(f"--batch {max(batches)} is larger than {MAX_BATCH}")
    horizon = max(batches) if args.exact else min(padding_horizon(max(batches)), MAX_BATCH)
    optimizer = make_optimizer(profile, cpus=cpus, max_batch=horizon)
    planner: Optimizer | PaddedPlans = optimizer if args.exact else PaddedPlans(optimizer)
    try:
        plans = [planner.plan(b) for b in batches]
    except PlanError as exc:
        raise CliError(str(exc)) from None
    if args.format == "json":
        payload: Any = plans[0].to_dict() if len(plans) == 1 else [p.to_dict() for p in plans]
        print(json.dumps(payload, indent=2))
    else:
        print(format_table(plans))
        for line in engine_notes(profile):
            print(line)
    if args.plot:
        curve = [planner.plan(b) for b in range(1, max(batches) + 1) if planner.feasible(b)]
        title = f"{profile.meta.model}: expected latency on {cpus} cores"
        try:
            plot_plans(curve, args.plot, title=title, marked=plans)
        except (OSError, ValueError) as exc:
            raise CliError(f"--plot {args.plot}: cannot write the plot: {exc}") from None
        print(f"plot written to {args.plot}")
    return 0
