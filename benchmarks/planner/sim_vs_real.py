"""Simulated vs measured P99 on a real ``packrat serve`` pod, same traces, open-loop replay.

Run: ``.venv/bin/python benchmarks/planner/sim_vs_real.py`` (about 5 minutes: the pod starts, then
one Poisson trace per load level is replayed with ``run_trace``, what ``packrat loadgen
--trace`` does). The DES gets the same trace, the profile the plan came from and the plan;
results go to ``benchmarks/results/sim-vs-real.{json,txt}``.

Calibration (``--calibrate N``, on by default): on a shared machine the pod does not get the
cores its profile was measured on, so before the load levels ``N`` requests are sent one
at a time (each after the previous answer: no queueing) and the ratio of their median
latency to the profile's single-request latency scales the whole profile for a second
simulation ("calibrated"). That checks the queueing and batching model at the service
times the pod has now; the raw simulation checks the profile too. A third simulation
("spread") also resamples the calibration requests' own spread per batch (their latencies
over their median, the DES's ``service_factors``): at low load, where queueing is rare, the
tail is that spread. Load levels are fractions of the calibrated capacity (``--loads``), or
absolute rates (``--rates``); ``--repeats`` runs every level that many times, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from packrat.bench.loadgen import Target
from packrat.bench.replay import run_trace
from packrat.bench.servers import Launch, PackratServe
from packrat.plan.des import nearest_rank, simulate
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile
from packrat.plan.traces import gamma_trace
from packrat.serve.codec import example_body

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Does the simulation match a real pod?"'
    " (#does-the-simulation-match-a-real-pod)"
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


DURATIONS = ("packrat_request_duration_seconds", "packrat_instance_request_duration_seconds")


def pod_sums(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the pod's dispatcher and per-instance duration histograms, so that a
    level's mean time inside the pod (vs at the client, vs simulated) is a difference."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {name: [0.0, 0.0] for name in DURATIONS}
    for family in text_string_to_metric_families(text):
        if family.name in out:
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    out[family.name][0] += sample.value
                elif sample.name.endswith("_count"):
                    out[family.name][1] += sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def mean_ms(before: tuple[float, float], after: tuple[float, float]) -> float:
    count = after[1] - before[1]
    return (after[0] - before[0]) / count * 1000.0 if count else float("nan")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    profile = load_profile(args.profile)
    plan = Optimizer.for_profile(profile, cpus=args.cpus, max_batch=args.batch).plan(args.batch)
    body = example_body(args.model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="packrat-simreal-") as tmp:
        launch = Launch(
            model=args.model,
            cpus=list(range(args.cpus)),
            workdir=Path(tmp),
            max_batch_delay_ms=5,
            startup_timeout_s=600,
        )
        pod = PackratServe(launch, plan=plan)
        target = Target(url=pod.url, model=pod.model, body=body)
        await pod.start()
        try:
            table = profile.table()
            single = [(t, 1) for t, _ in plan.expand()]
            # A fresh pod is slower for its first minute (allocator, kernels' caches): warm it
            # at half the profile's capacity before calibrating.
            nominal = sum(1000.0 / table[k] for k in single)
            warm = gamma_trace(0.5 * nominal, duration_s=args.warm_seconds, seed=99)
            await run_trace(target, arrivals_s=warm.tolist())
            alone = max(table[k] for k in single)
            factor = 1.0
            spread: list[float] = [1.0]
            if args.calibrate:  # each client sends one request at a time, after the last answer

                async def client(n: int) -> list[float]:
                    got: list[float] = []
                    for _ in range(n):
                        one = await run_trace(target, arrivals_s=[0.0])
                        got += [r.latency_s * 1000.0 for r in one.records if r.ok]
                    return got

                clients = max(1, args.calibrate_clients)
                per = max(1, args.calibrate // clients)
                lat = sorted(
                    x
                    for xs in await asyncio.gather(*(client(per) for _ in range(clients)))
                    for x in xs
                )
                median = lat[len(lat) // 2]
                factor = median / alone
                spread = [x / median for x in lat]
                print(
                    f"calibration ({clients} closed-loop clients): median {median:.1f} ms vs "
                    f"profile {alone:.1f} ms: factor {factor:.2f}",
                    flush=True,
                )
            scaled = {k: v * factor for k, v in table.items()}
            capacity = sum(1000.0 / scaled[k] for k in single)
            levels = args.rates or [round(f * capacity, 2) for f in args.loads]
            rates = [(rep, rate) for rep in range(args.repeats) for rate in levels]
            for i, (rep, rate) in enumerate(rates):
                trace = gamma_trace(rate, cv=args.cv, duration_s=args.duration, seed=i + 1)
                sums = pod_sums(pod.url)
                measured = await run_trace(target, arrivals_s=trace.tolist())
                after = pod_sums(pod.url)
                got = np.array([r.latency_s * 1000.0 for r in measured.records if r.ok])
                sim = simulate(trace, table, plan.expand(), max_batch_delay_ms=5.0)
                cal = simulate(trace, scaled, plan.expand(), max_batch_delay_ms=5.0)
                spr = simulate(
                    trace, scaled, plan.expand(), max_batch_delay_ms=5.0, service_factors=spread
                )
                rows.append(
                    {
                        "rate": rate,
                        "repeat": rep,
                        "arrivals": int(trace.size),
                        "errors": measured.errors,
                        "measured_p99_ms": nearest_rank(got, 99),
                        "measured_p50_ms": nearest_rank(got, 50),
                        "simulated_p99_ms": sim.p99_ms,
                        "simulated_p50_ms": sim.percentile(50),
                        "calibrated_p99_ms": cal.p99_ms,
                        "calibrated_p50_ms": cal.percentile(50),
                        "measured_mean_ms": float(got.mean()) if got.size else float("nan"),
                        "pod_mean_ms": mean_ms(sums[DURATIONS[0]], after[DURATIONS[0]]),
                        "instance_mean_ms": mean_ms(sums[DURATIONS[1]], after[DURATIONS[1]]),
                        "spread_mean_ms": spr.mean_ms,
                        "spread_p99_ms": spr.p99_ms,
                        "spread_p50_ms": spr.percentile(50),
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
        "calibration_clients": args.calibrate_clients,
        "calibration_spread": spread,
        "calibrated_capacity_per_s": capacity,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--profile", type=Path, default=RESULTS / "profile-resnet50-2cpu.json")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--rates", type=floats, default=None, help="absolute rates per second")
    parser.add_argument("--loads", type=floats, default=[0.3, 0.5, 0.7])
    parser.add_argument("--calibrate", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--calibrate-clients",
        type=int,
        default=1,
        help="closed-loop clients during calibration (the plan's instance count keeps every "
        "instance busy: service times under the contention queueing happens in)",
    )
    parser.add_argument("--warm-seconds", type=float, default=60.0)
    parser.add_argument("--cv", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--stem", default="sim-vs-real")
    args = parser.parse_args()
    doc = asyncio.run(main_async(args))
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"{doc['model']}, plan {doc['plan']} from {doc['profile']}, calibration factor "
        f"{doc['calibration_factor']:.2f} (capacity {doc['calibrated_capacity_per_s']:.1f}/s)",
        f"{'rate/s':>8}{'load':>6}{'sim P99':>9}{'cal P99':>9}{'spr P99':>9}{'real P99':>10}"
        f"{'real/cal':>9}{'real/spr':>9}{'spr P50':>9}{'real P50':>10}{'errors':>8}",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['rate']:>8.1f}{r['load']:>6.2f}{r['simulated_p99_ms']:>9.1f}"
            f"{r['calibrated_p99_ms']:>9.1f}{r['spread_p99_ms']:>9.1f}{r['measured_p99_ms']:>10.1f}"
            f"{r['measured_p99_ms'] / r['calibrated_p99_ms']:>9.2f}"
            f"{r['measured_p99_ms'] / r['spread_p99_ms']:>9.2f}"
            f"{r['spread_p50_ms']:>9.1f}{r['measured_p50_ms']:>10.1f}{r['errors']:>8}"
        )
    lines.append(
        "means (ms): client / pod (dispatcher) / instance (TorchServe) / spread simulation"
    )
    for r in doc["rows"]:
        lines.append(
            f"{r['rate']:>8.1f}{r['measured_mean_ms']:>9.1f}{r['pod_mean_ms']:>9.1f}"
            f"{r['instance_mean_ms']:>9.1f}{r['spread_mean_ms']:>9.1f}"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
