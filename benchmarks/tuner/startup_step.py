"""Start-up time in the tuner, in simulation: a 4x arrival-rate step with new replicas that
serve only ``--startup-s`` after the tuner asks for them.

The planner plans on a sample trace; the tuner replays the evaluation trace deciding every
second (:func:`packrat.plan.envelope.replay`); a scale-up serves ``--startup-s`` later (a
scale-down at once); the DES runs the resulting replica schedule. Side by side on the same
traces: the tuner as before (no start-up headroom) and with it (``startup_s`` and the growth
within a start-up the sample shows, :func:`packrat.plan.envelope.growth_within`), and fat
replicas sized for the evaluation trace's busiest second (CG-peak, given the trace in
advance). Workloads (ResNet-50's paper profile, SLO ``--slo-ms``):

- ``step, sample has it``: base rate then 4x, 120 s each; the sample is another trace of that
  process (the step happens, its time is not known);
- ``step, steady sample``: the same evaluation, the sample the base rate only (a step larger
  than any the sample shows);
- ``ramp``: 120 s at the base rate, then up to 4x over 60 s (linear), then 60 s at 4x; the
  sample has a ramp too.

Run: ``.venv/bin/python benchmarks/tuner/startup_step.py`` (a minute or two); writes
``benchmarks/results/startup-step.{json,txt}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from packrat.plan.des import simulate
from packrat.plan.envelope import Tuner, envelope, growth_within, replay, schedule, window_sizes
from packrat.plan.profile import load_profile
from packrat.plan.provision import Planner, provision
from packrat.plan.traces import gamma_trace, peak_rate, step_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the tuner follow a load step?"'
    " (#how-does-the-tuner-follow-a-load-step)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"


def ramp_trace(
    base: float, factor: float, lead_s: float, ramp_s: float, hold_s: float, seed: int
) -> np.ndarray:
    """Poisson arrivals at ``base`` for ``lead_s``, rising linearly to ``factor x base`` over
    ``ramp_s``, then holding for ``hold_s`` (thinning a Poisson process at the top rate)."""
    rng = np.random.default_rng(seed)
    top = base * factor
    total = lead_s + ramp_s + hold_s
    t = np.sort(rng.uniform(0.0, total, rng.poisson(top * total)))
    rise = np.clip((t - lead_s) / ramp_s, 0.0, 1.0)
    rate = base + (top - base) * rise
    out: np.ndarray = t[rng.uniform(0.0, top, t.size) < rate]
    return out


def tuned(
    planner: Planner,
    prov: Any,
    sample: np.ndarray,
    trace: np.ndarray,
    startup_s: float,
    aware: bool,
) -> tuple[list[tuple[float, int]], float]:
    cfg = prov.best.config
    windows = window_sizes(prov.plan.expected_latency_ms / 1000.0, min_window_s=0.1)
    # the growth within the time before a replica asked for at the next decision serves
    growth = growth_within(sample, startup_s + 1.0, noise_z=1.0) if aware else 1.0
    tuner = Tuner(
        planned_replicas=cfg.replicas,
        replica_capacity=planner.capacity(prov.best.instances),
        windows=windows,
        planned_rates=envelope(sample, [min(w, float(sample[-1])) for w in windows]).tolist(),
        max_replicas=planner.max_cores // cfg.cpus,
        scale_down_delay_s=60.0,
        noise_z=3.0,
        startup_s=startup_s if aware else 0.0,
        growth=growth,
    )
    steps = schedule(replay(tuner, trace, interval_s=1.0), initial=cfg.replicas)
    effective = [steps[0]]
    for (t, n), (_, prev) in zip(steps[1:], steps, strict=False):
        effective.append((t + startup_s, n) if n > prev else (t, n))
    effective.sort()
    return effective, growth


def mean_replicas(steps: list[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t, n), nxt in zip(steps, [*steps[1:], (end, 0)], strict=False):
        total += n * max(0.0, min(nxt[0], end) - min(t, end))
    return total / end


def run(table: dict, name: str, sample: np.ndarray, trace: np.ndarray, args: Any) -> dict:
    prov = provision(Planner(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores))
    planner = Planner(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores)
    cfg = prov.best.config
    end = float(trace[-1])
    rows: dict[str, Any] = {}
    for label, aware in (("tuner", False), ("tuner+startup", True)):
        steps, growth = tuned(planner, prov, sample, trace, args.startup_s, aware)
        res = simulate(trace, table, prov.best.instances, schedule=steps)
        rows[label] = {
            "cores": mean_replicas(steps, end) * cfg.cpus,
            "max_cores": max(n for _, n in steps) * cfg.cpus,
            "miss_rate": res.miss_rate(args.slo_ms),
            "p99_ms": res.p99_ms,
            "changes": len(steps) - 1,
            "growth": growth,
            "schedule": steps,
        }
    judge = Planner(table, trace, slo_ms=args.slo_ms, max_cores=args.max_cores * 4)
    peak = judge.baseline(peak_rate(trace, window_s=1.0))
    rows["cg-peak"] = {
        "cores": peak.config.cores,
        "miss_rate": peak.miss_rate,
        "p99_ms": peak.p99_ms,
    }
    return {"workload": name, "plan": cfg.label, "planned_cores": cfg.cores, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="base rate (x4 after the step)")
    parser.add_argument("--slo-ms", type=float, default=500.0)
    parser.add_argument("--startup-s", type=float, default=5.0)
    parser.add_argument("--max-cores", type=int, default=256)
    parser.add_argument("--stem", default="startup-step")
    args = parser.parse_args()
    table = dict(load_profile(PROFILE).table())
    r = args.rate
    step = step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=31)
    workloads = [
        ("step, sample has it", step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=41), step),
        ("step, steady sample", gamma_trace(r, cv=1.0, duration_s=60, seed=30), step),
        (
            "ramp",
            ramp_trace(r, 4.0, 120.0, 60.0, 60.0, seed=50),
            ramp_trace(r, 4.0, 120.0, 60.0, 60.0, seed=51),
        ),
    ]
    out = [run(table, name, sample, trace, args) for name, sample, trace in workloads]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(
        json.dumps({"args": vars(args), "results": out}, indent=1, default=float) + "\n"
    )
    lines = [
        f"4x step/ramp from {r:g}/s, SLO {args.slo_ms:g} ms, start-up {args.startup_s:g} s, "
        f"{PROFILE.name}",
    ]
    for w in out:
        lines.append("")
        lines.append(f"{w['workload']}: planned {w['plan']} ({w['planned_cores']} cores)")
        for label, row in w["rows"].items():
            extra = (
                f"  changes {row['changes']}, growth {row['growth']:.2f}"
                if "changes" in row
                else ""
            )
            lines.append(
                f"  {label:15}{row['cores']:>8.1f} cores{100 * row['miss_rate']:>8.2f}% misses"
                f"{row['p99_ms']:>10.1f} ms P99{extra}"
            )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
