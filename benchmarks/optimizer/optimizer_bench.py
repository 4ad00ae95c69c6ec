"""Optimizer speed on the Packrat paper's profiles: one DP pass answers every batch size.

Run: ``make bench-optimizer`` (or ``.venv/bin/python benchmarks/optimizer/optimizer_bench.py``).
Reports medians of repeated runs, with min and max, for T=16 / all B <= 1024 on each
published profile, and for a synthetic T=64 / B <= 1024 profile (the paper's shape scaled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How fast is the optimizer, and the simulation?"'
    " (#how-fast-is-the-optimizer-and-the-simulation)"
)

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"


def synthetic_table(cpus: int, max_batch: int) -> dict[tuple[int, int], float]:
    """An Amdahl-shaped profile: L(t, b) = b * (0.1 + 0.9 / t) * (1 + 0.02 * t) ms."""
    table = {}
    b = 1
    while b <= max_batch:
        for t in range(1, cpus + 1):
            table[(t, b)] = b * (0.1 + 0.9 / t) * (1 + 0.02 * t) * 10.0
        b *= 2
    return table


def timed(
    table: dict[tuple[int, int], float], *, cpus: int, max_batch: int, repeats: int
) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        opt = Optimizer(table, cpus=cpus, max_batch=max_batch)
        plans = [opt.plan(b) for b in range(1, max_batch + 1) if opt.feasible(b)]
        runs.append(time.perf_counter() - start)
        assert plans
    return {
        "median_s": statistics.median(runs),
        "min_s": min(runs),
        "max_s": max(runs),
        "repeats": repeats,
        "points": len(table),
    }


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    for path in sorted(PAPER.glob("*.csv")):
        profile = load_profile(path)
        results[f"{path.stem} T=16 B=1..1024"] = timed(
            profile.table(), cpus=16, max_batch=1024, repeats=args.repeats
        )
    results["synthetic T=64 B=1..1024"] = timed(
        synthetic_table(64, 1024), cpus=64, max_batch=1024, repeats=max(1, args.repeats // 2)
    )
    width = max(len(k) for k in results)
    print("every plan for every B from one optimizer pass; seconds over repeated runs")
    print(f"{'workload':<{width}}  points  median s    min s    max s")
    for name, r in results.items():
        print(
            f"{name:<{width}}  {int(r['points']):6d}  {r['median_s']:8.3f} "
            f"{r['min_s']:8.3f} {r['max_s']:8.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
