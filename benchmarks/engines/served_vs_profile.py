"""End to end through ``packrat serve`` (native runtime): the served engine plan's batch
latency against what its profile expected. Makes the "End to end through packrat serve"
figures of docs/measurements.md's engines section (raw results in
benchmarks/results/engines/).

For each batch B the plan is the one the operator would serve from the profile (the best
plan over the profile's engines, :meth:`packrat.plan.optimizer.Optimizer.for_profile`);
``packrat serve --plan ... --artefacts DIR`` serves it pinned to the cores, closed-loop bursts
of B requests (batch latency = until the last answer), batches interleaved over ``--reps``
rounds (a fresh server each run). Reported per B: the median over rounds of each run's
median batch latency, its spread, the profile's expected latency and their ratio.

    flock /tmp/packrat-bench.lock .venv/bin/python benchmarks/engines/served_vs_profile.py \\
        --model resnet50 --profile P.json --artefacts DIR --batches 8,16 --reps 3 --out R.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from packrat.bench.servers import Launch, PackratServe
from packrat.bench.serving import served_bursts
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import load_profile

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Which engine should each thin instance run: eager, ONNX Runtime or'
    " OpenVINO, against fat and OpenVINO's own hints?\""
    ', part "end to end through packrat serve"'
    " (#which-engine-should-a-thin-instance-run-against-fat-and-openvinos-own-hints)"
)


async def _one(args: argparse.Namespace, plan: Any, batch: int, workdir: Path) -> dict[str, Any]:
    from packrat.serve.codec import example_body

    launch = Launch(
        model=args.model,
        cpus=list(range(args.cpus)),
        workdir=workdir,
        max_batch_delay_ms=args.max_batch_delay_ms,
        startup_timeout_s=900,
    )
    server = PackratServe(launch, plan=plan, artefacts=args.artefacts)
    body = await asyncio.to_thread(example_body, args.model)
    result = await served_bursts(server, body=body, batch=batch, bursts=args.bursts)
    ms = [v * 1000 for v in result.batch_latencies_s]
    return {"median_ms": statistics.median(ms), "samples_ms": ms, "errors": result.errors}


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    profile = load_profile(args.profile)
    batches = [int(b) for b in args.batches.split(",")]
    optimizer = Optimizer.for_profile(profile, cpus=args.cpus, max_batch=max(batches))
    plans = {b: optimizer.plan(b) for b in batches}
    runs: dict[int, list[dict[str, Any]]] = {b: [] for b in batches}
    with tempfile.TemporaryDirectory(prefix="served-vs-profile-") as tmp:
        for rep in range(args.reps):
            order = batches[rep % len(batches) :] + batches[: rep % len(batches)]
            for b in order:
                run = await _one(args, plans[b], b, Path(tmp) / f"r{rep}-b{b}")
                runs[b].append(run)
                print(f"rep {rep} B={b} {plans[b].label}: {run['median_ms']:.1f} ms", flush=True)
    out: dict[str, Any] = {"model": args.model, "profile": str(args.profile), "batches": {}}
    for b in batches:
        medians = [r["median_ms"] for r in runs[b]]
        served = statistics.median(medians)
        expected = plans[b].expected_latency_ms
        out["batches"][str(b)] = {
            "plan": plans[b].label,
            "expected_ms": expected,
            "served_median_ms": served,
            "served_min_ms": min(medians),
            "served_max_ms": max(medians),
            "ratio": served / expected,
            "errors": sum(r["errors"] for r in runs[b]),
            "runs": runs[b],
        }
        print(
            f"B={b} {plans[b].label}: served {served:.1f} ms [{min(medians):.1f}-"
            f"{max(medians):.1f}] vs profile {expected:.1f} ms: {served / expected:.2f}x",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--profile", type=Path, required=True, help="a profile of engines")
    parser.add_argument("--artefacts", type=Path, required=True, help="its artefacts folder")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batches", default="8,16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bursts", type=int, default=5, help="recorded bursts per run")
    parser.add_argument("--max-batch-delay-ms", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    result = asyncio.run(_main(args))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
