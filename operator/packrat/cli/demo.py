"""``packrat demo``: the whole local workflow on this machine, with no cluster.

Profiles the default model (ResNet-50) on this machine's own cores, prints the optimal plans
for a few batch sizes with a plot, then measures plan vs fat vs one-instance-per-core side by
side. It is a thin sequence of the real subcommands, so what the demo shows is exactly what
``packrat profile``, ``packrat plan`` and ``packrat bench`` do.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packrat.cli import CliError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
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
    parser.set_defaults(func=run)


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
                "-o", str(profile),
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
    for title, argv in steps:
        print(f"\n== {title}\n$ packrat {' '.join(argv)}", flush=True)
        code = main(argv)
        if code:
            return code
    print(f"\nprofile: {profile}\nplot:    {out / 'plan.png'}")
    return 0
