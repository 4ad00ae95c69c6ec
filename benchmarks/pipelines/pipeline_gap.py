"""Greedy vs exhaustive search for a 2-stage pipeline on the Packrat paper's ResNet-50
profiles, restricted to a space exhaustive search can cover (replicas of 1-4 cores,
batches 1-8, at most 12 cores in all; a 30 s trace at 30 queries/s).

Run: ``.venv/bin/python benchmarks/pipelines/pipeline_gap.py`` (a few minutes on 2 busy cores).
Writes ``benchmarks/results/pipeline-gap.txt``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from packrat.plan.pipeline.search import PipelinePlanner, exhaustive
from packrat.plan.pipeline.simulate import Edge, Pipeline, Stage
from packrat.plan.profile import load_profile
from packrat.plan.provision import SimSettings
from packrat.plan.traces import gamma_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does a pipeline cost against coarse-grained provisioning?"'
    " (#what-does-a-pipeline-cost-against-coarse-grained-provisioning)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "benchmarks" / "profiles"


def small(name: str) -> dict[tuple[int, int], float]:
    table = load_profile(PROFILES / name).table()
    return {(t, b): v for (t, b), v in table.items() if t <= 4 and b <= 8}


def main() -> None:
    a, b = small("resnet-pytorch.csv"), small("resnet-torchserve.csv")
    lines = [
        f"{'fraction':>8}{'cv':>4}{'SLO ms':>8}{'greedy':>8}{'optimum':>8}{'gap %':>7}"
        f"{'greedy sims':>12}{'all sims':>9}  greedy plan"
    ]
    for fraction in (1.0, 0.3):
        p = Pipeline([Stage("first", a), Stage("second", b)], [Edge("first", "second", fraction)])
        for cv in (1.0, 4.0):
            trace = gamma_trace(30.0, cv=cv, duration_s=30.0, seed=3)
            for slo in (400.0,):
                sim = SimSettings(seed=3)
                planner = PipelinePlanner(p, trace, slo_ms=slo, max_cores=12, sim=sim)
                best, _ = planner.greedy()
                used = planner.evaluations
                opt = exhaustive(planner)
                g = best.cores if best.feasible else None
                o = opt.cores if opt else None
                gap = f"{100 * (g / o - 1):.0f}" if g and o else "-"
                lines.append(
                    f"{fraction:>8}{cv:>4g}{slo:>8g}{g or '-':>8}{o or '-':>8}{gap:>7}"
                    f"{used:>12}{planner.evaluations:>9}  {planner.label(best.configs)}"
                )
                print(lines[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / "pipeline-gap.txt"
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE).parse_args()
    start = time.process_time()
    main()
    print(f"cpu {time.process_time() - start:.0f} s")
