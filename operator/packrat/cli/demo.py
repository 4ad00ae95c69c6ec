"""``packrat demo``: the whole local workflow on this machine, with no cluster.

Profiles the default model (ResNet-50) on this machine's own cores, prints the optimal plans
for a few batch sizes with a plot, then measures plan vs fat vs one-instance-per-core side by
side. It is a thin sequence of the real subcommands, so what the demo shows is exactly what
``packrat profile``, ``packrat plan`` and ``packrat bench`` do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from packrat.cli import CliError, add_command

BANNER_WIDTH = 78


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "demo",
        run,
        help="profile, plan and benchmark the default model on this machine",
        description=(
            "Profile a model on this machine's cores, plan a few batch sizes (table and plot), "
            "and benchmark the plans against the fat instance. Takes a few minutes on 2 cores."
        ),
    )
    parser.add_argument("--model", default="resnet50", help="zoo name (default resnet50)")
    parser.add_argument("--cpus", type=int, help="T (default: every core this process may use)")
    parser.add_argument("--batch", default="4,8,16", help="batch sizes (default 4,8,16)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="output folder")
    parser.add_argument("--point-budget", type=float, default=4.0, metavar="S")
    parser.add_argument("--repeats", type=int, default=5, help="bench repetitions")


def run(args: argparse.Namespace) -> int:
    from packrat.cli import main
    from packrat.cli.plan import parse_int_list
    from packrat.runtime.cpus import allowed_cpus

    cores = allowed_cpus()
    cpus = args.cpus or len(cores)
    if cpus > len(cores):
        raise CliError(f"--cpus {cpus} exceeds the {len(cores)} cores this process may use")
    batches = parse_int_list(args.batch, what="--batch")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    profile = out / f"{args.model}-{cpus}cpu.json"
    steps: list[tuple[str, list[str]]] = [
        (
            f"1/3 profile {args.model} on {cpus} cores (resumes from {profile} if present)",
            [
                "profile", "--model", args.model, "--cpus", str(cpus),
                "--max-batch", str(max(batches)), "--point-budget", str(args.point_budget),
                "--allow-contended", "--progress-records", "off", "-o", str(profile),
            ],
        ),
        (
            "2/3 optimal plans from the profile",
            [
                "plan", "--profile", str(profile), "--cpus", str(cpus), "--batch", args.batch,
                "--plot", str(out / "plan.png"),
            ],
        ),
        (
            "3/3 measured: plan vs fat vs one instance per core (interleaved)",
            [
                "bench", "--model", args.model, "--cpus", str(cpus), "--batch", args.batch,
                "--profile", str(profile), "--repeats", str(args.repeats),
            ],
        ),
    ]  # fmt: skip
    contended: list[str] | None = None
    for title, argv in steps:
        print(f"\n== {title}\n$ packrat {' '.join(argv)}", flush=True)
        code = main(argv)
        if code:
            return code
        if argv[0] == "profile":
            contended = contention(profile)
            if contended is not None:
                print(banner(contended), flush=True)
    print(f"\nprofile: {profile}\nplot:    {out / 'plan.png'}")
    if contended is not None:
        print(banner(contended), flush=True)
    return 0


def contention(path: Path) -> list[str] | None:
    """The reasons a stored profile was measured on busy cores, or None when it was not."""
    try:
        extra = json.loads(path.read_text(encoding="utf-8"))["meta"].get("extra") or {}
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    isolation = extra.get("isolation") if isinstance(extra, dict) else None
    if not isinstance(isolation, dict) or not isolation.get("contaminated"):
        return None
    reasons = isolation.get("reasons") or ["the isolation check found the cores busy"]
    return [str(r) for r in reasons]


def banner(reasons: list[str]) -> str:
    """The warning a person cannot miss: the cores were busy, what that means, what to do."""
    lines = [
        "BUSY CORES: other work ran on these cores while the profile was measured.",
        *(f"  - {r}" for r in reasons[:4]),
        "The profile is kept and marked contended (meta.extra.contended); its latencies,",
        "the plans made from them and the measured speedups are indicative only.",
        "The demo goes on: plan and fat are still measured side by side, on the same",
        "busy cores. For clean figures, stop other work and run `make demo` again (the",
        "operator's profiling Job refuses such a profile on a dedicated node).",
    ]
    rule = "!" * BANNER_WIDTH
    body = "\n".join(f"!! {line}" for line in lines)
    text = f"\n{rule}\n{body}\n{rule}"
    if sys.stdout.isatty():  # bold red on a terminal
        return f"\x1b[1;31m{text}\x1b[0m"
    return text
