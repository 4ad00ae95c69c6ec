"""Plans that hold out of sample: plan on one trace, simulate the answer on fresh traces.

For each workload the planner (``packrat provision``'s, :func:`packrat.plan.provision.provision`)
plans on one trace of a process, and the answer is simulated (``packrat simulate``'s
:func:`packrat.plan.simulation.simulate_config`) on ``--fresh`` fresh traces of the same
process (other seeds, the same length). Side by side, in one run: the planner before issue 27
(``git show <--before>:operator/packrat/plan/provision.py``, loaded as a module; same DES)
and now. Reported per workload and planner: the configuration, its cores, the planned P99 and
utilisation, and on the fresh traces the P99s and how many met the SLO.

Workloads (ResNet-50, the Packrat paper's TorchServe profile, T = 16, SLO 1000 ms unless
said): steady Poisson at 400/s; bursty gamma CV 4 with a 4x step (100/s, then 400/s, half the
trace each); the issue's 100/s Poisson; 20/s Poisson with SLO 100 ms (a short trace's tail).

Run: ``.venv/bin/python benchmarks/planner/robust_planner.py [--seconds 300] [--fresh 5]``; writes
``benchmarks/results/robust-planner[-<stem>].{json,txt}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from packrat.plan.profile import load_profile
from packrat.plan.provision import provision
from packrat.plan.simulation import simulate_config
from packrat.plan.traces import gamma_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How many cores does a P99 SLO take, and does the plan hold out of sample?"'
    " (#how-many-cores-does-a-p99-slo-take-and-does-the-plan-hold-out-of-sample)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"


def step_gamma(rates: list[float], cv: float, seconds: float, seed: int) -> np.ndarray:
    """Equal phases at each rate, gamma CV ``cv`` (the bursty step process)."""
    phase = seconds / len(rates)
    parts = [
        gamma_trace(r, cv=cv, duration_s=phase, seed=seed * 100 + i) + i * phase
        for i, r in enumerate(rates)
    ]
    return np.concatenate(parts)


def workloads(seconds: float) -> list[dict[str, Any]]:
    return [
        {
            "name": "Poisson 400/s",
            "slo": 1000.0,
            "make": lambda s: gamma_trace(400.0, cv=1.0, duration_s=seconds, seed=s),
        },
        {
            "name": "CV 4, 100 -> 400/s step",
            "slo": 1000.0,
            "make": lambda s: step_gamma([100.0, 400.0], 4.0, seconds, s),
        },
        {
            "name": "Poisson 100/s",
            "slo": 1000.0,
            "make": lambda s: gamma_trace(100.0, cv=1.0, duration_s=seconds, seed=s),
        },
        {
            "name": "Poisson 20/s, SLO 100",
            "slo": 100.0,
            "make": lambda s: gamma_trace(20.0, cv=1.0, duration_s=seconds, seed=s),
        },
    ]


def old_planner(rev: str) -> ModuleType:
    """The planner as it was at ``rev`` (its own file; the DES and optimizer are today's,
    unchanged by issue 27)."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:operator/packrat/plan/provision.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "provision_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("provision_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["provision_before"] = module
    spec.loader.exec_module(module)
    return module


def evaluate(table: dict, answer: Any, slo: float, fresh: list[np.ndarray]) -> dict[str, Any]:
    instances = answer.best.instances
    n = answer.best.config.replicas
    runs = [simulate_config(table, t, instances, replicas=n, slo_ms=slo) for t in fresh]
    util = simulate_config(table, fresh[0][:1000], instances, replicas=n).capacity_per_replica
    return {
        "config": f"{n}x{answer.best.config.cpus}c/b{answer.best.config.batch}"
        + ("/per-core" if getattr(answer.best.config, "shape", "packrat") == "per_core" else ""),
        "cores": answer.best.config.cores,
        "planned_p99_ms": answer.best.p99_ms,
        "feasible": answer.feasible,
        "capacity_per_replica": util,
        "fresh_p99_ms": [r.p99_ms for r in runs],
        "fresh_utilization": [r.utilization for r in runs],
        "fresh_met": sum(bool(r.meets_slo) for r in runs),
        "evaluations": answer.evaluations,
        "wall_s": answer.wall_s,
        "warnings": list(getattr(answer, "warnings", [])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--seconds", type=float, default=300.0, help="every trace's length")
    parser.add_argument("--plan-seconds", type=float, help="the planning trace's length")
    parser.add_argument("--fresh", type=int, default=5)
    parser.add_argument("--before", default="house", help="git revision of the old planner")
    parser.add_argument("--only", help="comma-separated workload name prefixes")
    parser.add_argument("--stem", default="robust-planner")
    args = parser.parse_args()
    table = dict(load_profile(PROFILE).table())
    before = old_planner(args.before)
    rows = []
    planning = workloads(args.plan_seconds or args.seconds)
    for i, w in enumerate(workloads(args.seconds)):
        if args.only and not any(w["name"].startswith(p) for p in args.only.split(",")):
            continue
        sample = planning[i]["make"](0)
        fresh = [w["make"](s) for s in range(1, args.fresh + 1)]
        for label, plan in (("before", before.provision), ("now", provision)):
            start = time.process_time()
            answer = plan(table, sample, slo_ms=w["slo"])
            row = evaluate(table, answer, w["slo"], fresh)
            row.update(
                workload=w["name"],
                planner=label,
                slo_ms=w["slo"],
                planned_utilization=getattr(answer.best, "utilization", None),
                cpu_s=time.process_time() - start,
            )
            rows.append(row)
            print(
                json.dumps(
                    {
                        k: row[k]
                        for k in (
                            "workload",
                            "planner",
                            "config",
                            "cores",
                            "planned_p99_ms",
                            "planned_utilization",
                            "fresh_met",
                        )
                    }
                ),
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args), "profile": str(PROFILE.relative_to(ROOT)), "rows": rows}
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    lines = [
        f"plan on one {args.plan_seconds or args.seconds:g} s trace (seed 0), simulate on "
        f"{args.fresh} fresh {args.seconds:g} s traces (seeds 1-{args.fresh}); {doc['profile']}",
        "",
    ]
    lines.append(
        f"{'workload':26}{'planner':>8}{'config':>20}{'cores':>7}{'plan P99':>10}{'util':>7}"
        "  fresh P99 ms (met/of)"
    )
    for r in rows:
        util = r["planned_utilization"]
        lines.append(
            f"{r['workload']:26}{r['planner']:>8}{r['config']:>20}{r['cores']:>7}"
            f"{r['planned_p99_ms']:>10.1f}"
            f"{'' if util is None else format(util, '.3f'):>7}  "
            + " ".join(format(p, ".0f") for p in r["fresh_p99_ms"])
            + f" ({r['fresh_met']}/{len(r['fresh_p99_ms'])})"
        )
        for warning in r["warnings"]:
            lines.append(f"{'':34}warning: {warning}")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
