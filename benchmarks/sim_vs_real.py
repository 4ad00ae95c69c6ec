"""Simulated vs measured P99 on a real ``packrat serve`` pod, same traces, open-loop replay.

Run: ``.venv/bin/python benchmarks/sim_vs_real.py`` (about 5 minutes: the pod starts, then
one Poisson trace per load level is replayed with ``run_trace``, what ``packrat loadgen
--trace`` does). The DES gets the same trace, the profile the plan came from and the plan;
results go to ``benchmarks/results/sim-vs-real.{json,txt}``.

Calibration (``--calibrate N``, on by default): on a shared machine the pod does not get the
cores its profile was measured on, so before the load levels ``N`` requests are sent one
at a time (each after the previous answer: no queueing) and the ratio of their median
latency to the profile's single-request latency scales the whole profile for a second
simulation ("calibrated"). That checks the queueing and batching model at the service
times the pod has now; the raw simulation checks the profile too. Load levels are
fractions of the calibrated capacity (``--loads``), or absolute rates (``--rates``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packrat.bench.servers import PackratServe
from packrat.plan.des import nearest_rank, simulate
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile
from packrat.plan.traces import gamma_trace
from packrat.serve.codec import example_body
from packrat.serve.replay import run_trace

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    profile = load_profile(args.profile)
    plan = Optimizer.for_profile(profile, cpus=args.cpus, max_batch=args.batch).plan(args.batch)
    body = example_body(args.model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="packrat-simreal-") as tmp:
        pod = PackratServe(
            model=args.model,
            plan=plan,
            cpus=list(range(args.cpus)),
            workdir=Path(tmp),
            max_batch_delay_ms=5,
            startup_timeout_s=600,
        )
        await pod.start()
        try:
            warm = gamma_trace(2.0, duration_s=5.0, seed=99)
            await run_trace(url=pod.url, model=pod.model, body=body, arrivals_s=warm.tolist())
            table = profile.table()
            single = [(t, 1) for t, _ in plan.expand()]
            alone = max(table[k] for k in single)
            factor = 1.0
            if args.calibrate:  # one request at a time, each after the last answer
                lat = []
                for _ in range(args.calibrate):
                    one = await run_trace(url=pod.url, model=pod.model, body=body, arrivals_s=[0.0])
                    lat += [r.latency_s * 1000.0 for r in one.records if r.ok]
                lat.sort()
                factor = lat[len(lat) // 2] / alone
                print(
                    f"calibration: median {lat[len(lat) // 2]:.1f} ms alone vs profile "
                    f"{alone:.1f} ms: factor {factor:.2f}",
                    flush=True,
                )
            scaled = {k: v * factor for k, v in table.items()}
            capacity = sum(1000.0 / scaled[k] for k in single)
            rates = args.rates or [round(f * capacity, 2) for f in args.loads]
            for i, rate in enumerate(rates):
                trace = gamma_trace(rate, cv=args.cv, duration_s=args.duration, seed=i + 1)
                measured = await run_trace(
                    url=pod.url, model=pod.model, body=body, arrivals_s=trace.tolist()
                )
                lat = np.array([r.latency_s * 1000.0 for r in measured.records if r.ok])
                sim = simulate(trace, table, plan.expand(), max_batch_delay_ms=5.0)
                cal = simulate(trace, scaled, plan.expand(), max_batch_delay_ms=5.0)
                rows.append(
                    {
                        "rate": rate,
                        "arrivals": int(trace.size),
                        "errors": measured.errors,
                        "measured_p99_ms": nearest_rank(lat, 99),
                        "measured_p50_ms": nearest_rank(lat, 50),
                        "simulated_p99_ms": sim.p99_ms,
                        "simulated_p50_ms": sim.percentile(50),
                        "calibrated_p99_ms": cal.p99_ms,
                        "calibrated_p50_ms": cal.percentile(50),
                        "load": rate / capacity,
                        "send_lag_ms": measured.late_s * 1000.0,
                    }
                )
                print(rows[-1], flush=True)
        finally:
            await pod.stop()
    return {
        "model": args.model,
        "profile": str(args.profile),
        "plan": plan.label,
        "calibration_factor": factor,
        "calibrated_capacity_per_s": capacity,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--profile", type=Path, default=RESULTS / "profile-resnet50-2cpu.json")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--rates", type=floats, default=None, help="absolute rates per second")
    parser.add_argument("--loads", type=floats, default=[0.3, 0.5, 0.7])
    parser.add_argument("--calibrate", type=int, default=15)
    parser.add_argument("--cv", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--stem", default="sim-vs-real")
    args = parser.parse_args()
    doc = asyncio.run(main_async(args))
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"{doc['model']}, plan {doc['plan']} from {doc['profile']}, calibration factor "
        f"{doc['calibration_factor']:.2f} (capacity {doc['calibrated_capacity_per_s']:.1f}/s)",
        f"{'rate/s':>8}{'load':>6}{'sim P99':>9}{'cal P99':>9}{'real P99':>10}{'real/cal':>9}"
        f"{'cal P50':>9}{'real P50':>10}{'errors':>8}",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['rate']:>8.1f}{r['load']:>6.2f}{r['simulated_p99_ms']:>9.1f}"
            f"{r['calibrated_p99_ms']:>9.1f}{r['measured_p99_ms']:>10.1f}"
            f"{r['measured_p99_ms'] / r['calibrated_p99_ms']:>9.2f}"
            f"{r['calibrated_p50_ms']:>9.1f}{r['measured_p50_ms']:>10.1f}{r['errors']:>8}"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
