"""How much do monotone (padded) plans gain on the paper's profiles? Makes the table of
docs/measurements.md, "How much slower than a larger batch can an exact plan be, and what does
padding gain?".

For each of the 8 published profiles (benchmarks/profiles/packrat-paper, T=16) and every batch
B in 1..--max-batch: the optimizer's expected latency for exactly B, the padded plan's (the
best plan for any B' >= B, slots left idle), how many B the exact plans make slower than a
larger batch, the largest such ratio, and how many B padding changes. Expected latencies from
the profiles (the optimizer's figures, no timing), so the numbers are exact and reproducible.

    python benchmarks/optimizer/padding_gain.py [--max-batch 128] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from packrat.plan.optimizer import Optimizer
from packrat.plan.padding import PaddedPlans, padding_horizon
from packrat.plan.profile import load_profile

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How much slower than a larger batch can an exact plan be, and what'
    ' does padding gain?"'
    " (#how-much-slower-than-a-larger-batch-can-an-exact-plan-be-and-what-does-padding-gain)"
)

PAPER = Path(__file__).resolve().parents[1] / "profiles" / "packrat-paper"


def gain(path: Path, *, cpus: int, max_batch: int) -> dict[str, object]:
    """One profile's figures (see the module docstring)."""
    opt = Optimizer.for_profile(load_profile(path), cpus=cpus, max_batch=padding_horizon(max_batch))
    plans = PaddedPlans(opt)
    batches = range(1, max_batch + 1)
    exact = [opt.latency(b) for b in batches]
    padded = [plans.latency(b) for b in batches]
    falls = [(exact[i] / exact[i + 1], i + 1) for i in range(max_batch - 1)
             if exact[i] > exact[i + 1]]  # fmt: skip
    worst = max(falls, default=(1.0, None))
    gains = [(e / p, b) for b, e, p in zip(batches, exact, padded, strict=True) if p < e]
    best = max(gains, default=(1.0, None))
    return {
        "profile": path.name,
        "batches": max_batch,
        "exact_falls": len(falls),
        "exact_worst_fall": round(worst[0], 3),
        "exact_worst_fall_at": worst[1],
        "padded_falls": sum(padded[i] > padded[i + 1] for i in range(max_batch - 1)),
        "padded_batches": len(gains),
        "largest_gain": round(best[0], 3),
        "largest_gain_at": best[1],
        "largest_gain_ms": None
        if best[1] is None
        else [round(exact[best[1] - 1], 1), round(padded[best[1] - 1], 1)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--cpus", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=128)
    parser.add_argument("--out", type=Path, help="write the rows as JSON too")
    args = parser.parse_args()
    rows = [gain(p, cpus=args.cpus, max_batch=args.max_batch) for p in sorted(PAPER.glob("*.csv"))]
    head = ("profile", "exact falls", "worst fall", "padded falls", "padded B", "largest gain")
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r['profile']} | {r['exact_falls']} | {r['exact_worst_fall']}x at "
            f"B={r['exact_worst_fall_at']} | {r['padded_falls']} | {r['padded_batches']} | "
            f"{r['largest_gain']}x at "
            f"B={r['largest_gain_at']} ({r['largest_gain_ms']} ms)"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
