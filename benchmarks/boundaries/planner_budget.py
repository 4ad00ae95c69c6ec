"""Issue 26, item 4: the pipeline planner at the admitted maximum (16 stages in a chain,
200,000 arrivals) under the operator's default budget, planned the way the operator plans
(:func:`packrat.controller.pipeline.plan_job.run_bounded`, a child forked from the fork
server). Prints the outcome, the wall time to it, and this process's (the operator's) peak RSS
before and after: the planning's memory is the child's, bounded by its address-space limit.

    python benchmarks/boundaries/planner_budget.py --seconds 60 --memory-mib 320
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

from packrat.controller.pipeline.plan_job import PlanBudget, PlanJobError, run_bounded
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint
from packrat.plan.traces import gamma_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Is every boundary bounded?"'
    " (#is-every-boundary-bounded)"
)


def rss_mib(field: str = "VmHWM") -> float:
    text = Path("/proc/self/status").read_text()
    return int(next(x for x in text.splitlines() if x.startswith(field + ":")).split()[1]) / 1024


def profile_json() -> str:
    lat = {(1, 1): 1.0, (1, 2): 1.8, (1, 4): 3.5, (1, 8): 7.0}
    lat |= {(2, 1): 0.8, (2, 2): 1.2, (2, 4): 2.2, (2, 8): 4.3}
    points = tuple(ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in lat.items())
    return Profile(meta=ProfileMeta(model="tiny", cpu_model="x", cpus=2), points=points).to_json()


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--memory-mib", type=int, default=320)
    parser.add_argument("--stages", type=int, default=16)
    args = parser.parse_args()
    names = [f"s{i}" for i in range(args.stages)]
    trace = gamma_trace(2000.0, cv=1.0, duration_s=100.0, seed=0)  # 200,000 arrivals
    job = {
        "stages": [{"name": n, "profile": profile_json(), "cpus": 2} for n in names],
        "edges": [[a, b, 1.0] for a, b in itertools.pairwise(names)],
        "trace": [float(t) for t in trace],
        "sloMs": 200.0,
        "maxCores": None,
        "delayMs": 5.0,
        "hopMs": 1.0,
    }
    before = rss_mib()
    start = time.monotonic()
    try:
        run_bounded(job, PlanBudget(seconds=args.seconds, memory_mib=args.memory_mib))
        outcome = "planned"
    except PlanJobError as exc:
        outcome = f"{exc.reason}: {exc}"
    doc = {
        "stages": args.stages,
        "arrivals": int(trace.size),
        "budget": {"seconds": args.seconds, "memory_mib": args.memory_mib},
        "outcome": outcome,
        "wall_s": round(time.monotonic() - start, 1),
        "operator_peak_rss_mib": {"before": round(before, 1), "after": round(rss_mib(), 1)},
        "load": os.getloadavg(),
    }
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
