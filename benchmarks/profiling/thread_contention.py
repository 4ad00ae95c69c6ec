"""Why Packrat pods need exclusive cores: a multi-threaded instance beside one busy process.

An intra-op-parallel forward pass (OpenMP) ends every operator at a barrier, so it runs at the
pace of its slowest thread. When another process shares one of its cores, the thread there gets
half a core and the whole instance slows down with it; a one-thread instance on a core nobody
else uses does not notice. This is what Guaranteed QoS with the static CPU manager prevents in a
cluster, and what a shared development machine (profiling Jobs, load generators, proxies and
serving pods on the same cores) cannot: it explains the erratic multi-thread points of profiles
measured on this machine and the slow fat baseline of the reconfiguration experiment.

The benchmark measures, side by side in one run and in alternating order: a one-thread instance
on core 0 and a ``--threads``-thread instance on cores 0..T-1, each alone and then with a busy
loop pinned to core T-1 (a fresh process per measurement). It reports medians and the slowdown
ratios (busy / alone).

Run: ``.venv/bin/python benchmarks/profiling/thread_contention.py --model resnet50 --batch 4``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Do profiles hold beside busy neighbours?"'
    " (#do-profiles-hold-beside-busy-neighbours)"
)

RESULTS = Path(__file__).resolve().parents[1] / "results"
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def worker(model: str, batch: int, cores: list[int], iters: int) -> None:
    """One measurement in a fresh process: pin, set threads, warm up, time ``iters`` passes."""
    os.sched_setaffinity(0, set(cores))
    import torch

    from packrat.runtime.zoo import example_input, load_model

    torch.set_num_threads(len(cores))
    net = load_model(model).eval()
    x = example_input(model, batch)
    times = []
    with torch.inference_mode():
        for _ in range(3):
            net(x)
        for _ in range(iters):
            start = time.perf_counter()
            net(x)
            times.append(time.perf_counter() - start)
    print(json.dumps({"median_ms": 1000.0 * statistics.median(times)}))


def measure(
    *, model: str, batch: int, cores: list[int], iters: int, busy_core: int | None
) -> float:
    hog = (
        subprocess.Popen([sys.executable, "-c", BUSY, str(busy_core)])
        if busy_core is not None
        else None
    )
    try:
        cmd = [sys.executable, __file__, "--worker", model, str(batch), ",".join(map(str, cores))]
        out = subprocess.run(
            [*cmd, str(iters)], capture_output=True, text=True, check=True, timeout=900
        ).stdout
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return float(json.loads(out)["median_ms"])


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--worker"]:
        model, batch, cores, iters = args_list[1:5]
        worker(model, int(batch), [int(c) for c in cores.split(",")], int(iters))
        return 0
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="the fat instance's threads (>= 2)")
    parser.add_argument("--iters", type=int, default=8, help="timed passes per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args(args_list)
    available = sorted(os.sched_getaffinity(0))
    if args.threads < 2 or args.threads > len(available):
        parser.error(f"--threads must be in 2..{len(available)} (cores here: {available})")
    fat = available[: args.threads]
    thin, busy_core = fat[:1], fat[-1]
    cases = [
        ("1 thread", thin, None),
        (f"{args.threads} threads", fat, None),
        ("1 thread", thin, busy_core),
        (f"{args.threads} threads", fat, busy_core),
    ]
    results: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.rounds):
        order = cases if r % 2 == 0 else list(reversed(cases))
        for label, cores, busy in order:
            ms = measure(
                model=args.model, batch=args.batch, cores=cores, iters=args.iters, busy_core=busy
            )
            results.setdefault((label, busy is not None), []).append(ms)
            print(f"round {r}: {label} on {cores}, busy core {busy}: {ms:.1f} ms", flush=True)
    lines = [
        f"thread contention: model {args.model}, batch {args.batch}, cores {fat}, busy loop on "
        f"core {busy_core}; median of {args.iters} passes per measurement, {args.rounds} rounds "
        f"(order alternating), median over rounds",
        "command: .venv/bin/python benchmarks/profiling/thread_contention.py "
        + " ".join(args_list),
        "",
        "instance | alone ms | beside a busy core ms | slowdown",
        "---|---|---|---",
    ]
    for label in ("1 thread", f"{args.threads} threads"):
        alone = statistics.median(results[(label, False)])
        busy = statistics.median(results[(label, True)])
        lines.append(f"{label} | {alone:.1f} | {busy:.1f} | {busy / alone:.2f}x")
    report = "\n".join(lines)
    print(report)
    if args.out:
        out = Path(args.out)
        out = out if out.is_absolute() else RESULTS / out
        out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
