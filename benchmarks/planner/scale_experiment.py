"""Packrat on one node, end to end: profile (co-located and alone), plan, bench, one table.

Issue 24's experiment in one script, for a machine of any size (compare the first 16-core
run's ``run16.sh`` in ``/work/shared/measurements/xeon16-resnet50/``):

1. the machine's facts (cpus, lscpu, torch, load average) to ``machine.txt``;
2. ``packrat profile`` in each mode (``--modes``, default ``co-located,alone``), the real
   CLI, each under a time budget: ``profile-<mode>.json`` and ``.log`` (points measured,
   worker start-up and its share of the profile's time);
3. ``packrat plan`` on each profile (``plan-<mode>.txt``);
4. Packrat's microbenchmark with every profile's plan and the fat instance in one
   interleaving (configurations rotate every repetition; medians), per batch size:
   ``bench.json``;
5. the issue's table per mode, printed and written to ``table.md``: B, plan, expected plan
   ms, measured plan ms, measured fat ms, speedup over fat, actual/expected speedup,
   measured/expected plan latency, and the plan the operator would serve: the first mode's
   profile verifies its plans against fat as the operator's profiling Job does
   (``--verify-batches``), and a plan that measured more than 5% slower than fat there is
   served as the fat instance.

Sized for 16 cores in under 8 minutes with the defaults (coarse thread grid, 35 points per
profile at ``--max-batch 64``; budgets 180 s co-located, 120 s alone; 5 repetitions).
On this 2-core machine::

    .venv/bin/python benchmarks/planner/scale_experiment.py --model resnet50 --cpus 2 \\
        --batch 4,8,16 --max-batch 16 --repeats 8 --out benchmarks/results/scale24/resnet50-2cpu

On a 16-core machine, from a checkout with the project installed::

    python benchmarks/planner/scale_experiment.py --model resnet50 --cpus 16 --out out16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from packrat.bench.microbench import BatchResult, run_bench  # noqa: E402
from packrat.plan.profile import Profile, load_profile  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How much faster is a plan than one fat instance?"'
    " (#how-much-faster-is-a-plan-than-one-fat-instance)"
)

PACKRAT = [sys.executable, "-m", "packrat"]
MODES = ("co-located", "alone")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "operator"), env.get("PYTHONPATH")])
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def machine_facts(out: Path) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "loadavg": os.getloadavg(),
    }
    lscpu = shutil.which("lscpu")
    text = json.dumps(facts, indent=2) + "\n"
    if lscpu:
        text += subprocess.run([lscpu], capture_output=True, text=True, check=False).stdout
    (out / "machine.txt").write_text(text)
    return facts


def profile(args: argparse.Namespace, mode: str, out: Path) -> dict[str, Any]:
    """One real ``packrat profile`` run; what it did, from its log and file."""
    path = out / f"profile-{mode}.json"
    path.unlink(missing_ok=True)
    budget = args.colocated_budget if mode == "co-located" else args.alone_budget
    cmd = [
        *PACKRAT, "profile", "--model", args.model, "--cpus", str(args.cpus),
        "--max-batch", str(args.max_batch), "--precision", str(args.precision),
        "--point-budget", str(args.point_budget), "--time-budget", str(budget),
        "--warmup", str(args.warmup), "--min-samples", str(args.min_samples),
        "--mode", mode, "--thread-grid", args.thread_grid, "--allow-contended", "-o", str(path),
    ]  # fmt: skip
    if args.threads:
        cmd += ["--threads", args.threads]
    if mode == args.modes.split(",")[0] and args.verify_repeats > 0:  # the default profile
        cmd += ["--verify-batches", args.batch, "--verify-repeats", str(args.verify_repeats)]
    began = time.monotonic()
    load = os.getloadavg()[0]
    with (out / f"profile-{mode}.log").open("w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), check=False,
            timeout=budget + 600,
        )  # fmt: skip
    seconds = time.monotonic() - began
    if proc.returncode != 0 or not path.exists():
        raise SystemExit(f"packrat profile --mode {mode} failed (exit {proc.returncode}): see log")
    prof = load_profile(path)
    extra = prof.meta.extra
    startup = (extra.get("startup_s") or {}).get("workers", 0.0)
    grid = extra.get("grid") or {}
    total = len(grid.get("threads", [])) * len(grid.get("batches", []))
    return {
        "mode": mode,
        "seconds": round(seconds, 1),
        "points": len(prof.points),
        "grid_points": total,
        "complete": bool(extra.get("complete")),
        "startup_s": startup,
        "startup_share": round(startup / seconds, 3) if seconds else None,
        "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)],
        "thread_grid": extra.get("thread_grid"),
    }


def plan_text(args: argparse.Namespace, mode: str, out: Path) -> None:
    cmd = [*PACKRAT, "plan", "--profile", str(out / f"profile-{mode}.json")]
    cmd += ["--cpus", str(args.cpus), "--batch", args.batch]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=False)
    (out / f"plan-{mode}.txt").write_text(done.stdout + done.stderr)


NOISE = 0.05  # the operator's: a plan verified more than 5% slower than fat is not served


def refused(prof: Profile, label: str, batch: int) -> dict[str, Any] | None:
    """The profiling run's verification of plan ``label`` at ``batch`` when it lost to fat
    beyond noise: the operator serves the fat instance instead (controller.profiling.verified)."""
    record = prof.meta.extra.get("verified") or {}
    for entry in record.get("results") or []:
        same = entry.get("batch") == batch and entry.get("label") == label
        if same and float(entry["planMs"]) > float(entry["fatMs"]) * (1 + NOISE):
            return dict(entry)
    return None


def rows(results: list[BatchResult], name: str, prof: Profile, cpus: int) -> list[dict[str, Any]]:
    """One row per batch for the plan of ``prof`` (bench configuration ``name``): its
    expectations from that profile, the medians measured side by side with fat, and the
    plan the operator would serve (fat where the profile's verification refused the plan)."""
    out = []
    for r in results:
        plan, fat = r.configs[name], r.configs["fat"]
        lost = refused(prof, plan.config.label, r.batch)
        served = fat if lost else plan
        expected_ms = plan.config.expected_ms
        fat_expected = prof.latency(cpus, r.batch)
        measured_speedup = fat.summary.p50 / plan.summary.p50
        expected_speedup = fat_expected / expected_ms if expected_ms and fat_expected else None
        out.append(
            {
                "batch": r.batch,
                "plan": plan.config.label,
                "expected_ms": expected_ms,
                "plan_ms": plan.summary.p50,
                "plan_spread": [plan.summary.min, plan.summary.max],
                "fat_ms": fat.summary.p50,
                "fat_spread": [fat.summary.min, fat.summary.max],
                "speedup": measured_speedup,
                "expected_speedup": expected_speedup,
                "actual_over_expected": (
                    measured_speedup / expected_speedup if expected_speedup else None
                ),
                "measured_over_expected_ms": (
                    plan.summary.p50 / expected_ms if expected_ms else None
                ),
                "served": served.config.label,
                "served_ms": served.summary.p50,
                "served_speedup": fat.summary.p50 / served.summary.p50,
                "verified": lost,
            }
        )
    return out


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def table(mode: str, data: list[dict[str, Any]]) -> str:
    lines = [
        f"profile mode: {mode}",
        "",
        "| B | plan | expected plan ms | measured plan ms [min-max] | measured fat ms [min-max] "
        "| speedup over fat | actual/expected speedup | measured/expected plan ms "
        "| served (verified) | served speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in data:
        lines.append(
            f"| {d['batch']} | {d['plan']} | {_ms(d['expected_ms'])} "
            f"| {_ms(d['plan_ms'])} [{_ms(d['plan_spread'][0])}-{_ms(d['plan_spread'][1])}] "
            f"| {_ms(d['fat_ms'])} [{_ms(d['fat_spread'][0])}-{_ms(d['fat_spread'][1])}] "
            f"| {d['speedup']:.2f}x | {_f(d['actual_over_expected'], '.2f')} "
            f"| {_f(d['measured_over_expected_ms'], '.2f')} "
            f"| {d['served']}{' (plan refused)' if d['verified'] else ''} "
            f"| {d['served_speedup']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--cpus", type=int, default=16)
    parser.add_argument("--batch", default="8,16,32,64", help="batch sizes to bench")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--thread-grid", default="coarse", help="packrat profile --thread-grid")
    parser.add_argument("--threads", help="packrat profile --threads (overrides the grid)")
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--point-budget", type=float, default=8.0)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--min-samples", type=int, default=3)
    parser.add_argument("--colocated-budget", type=float, default=180.0)
    parser.add_argument("--alone-budget", type=float, default=120.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--verify-repeats",
        type=int,
        default=3,
        help="the default profile verifies its plans against fat (as the operator's Job): "
        "repetitions per batch, 0 to skip",
    )
    parser.add_argument("--out", type=Path, default=Path("out-scale"))
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: a comma-separated subset of {','.join(MODES)}")
    batches = [int(b) for b in args.batch.split(",")]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    facts = machine_facts(out)
    print(f"machine: {facts['nproc']} cpus, torch {facts['torch']}, load {facts['loadavg']}")
    runs = {}
    for mode in modes:
        runs[mode] = profile(args, mode, out)
        plan_text(args, mode, out)
        r = runs[mode]
        print(
            f"profile {mode}: {r['points']}/{r['grid_points']} points in {r['seconds']} s, "
            f"worker start-up {r['startup_s']:.1f} s ({100 * (r['startup_share'] or 0):.0f}%), "
            f"load {r['loadavg']}"
        )
    profiles: dict[str, Profile] = {m: load_profile(out / f"profile-{m}.json") for m in modes}
    first, *rest = modes
    load_before = os.getloadavg()[0]
    bench_began = time.monotonic()
    results = run_bench(
        spec=args.model,
        cpus=args.cpus,
        batches=batches,
        profile=profiles[first],
        repeats=args.repeats,
        warmup=1,
        names=("plan", "fat"),
        others={m: profiles[m] for m in rest},
        stream=sys.stderr,
    )
    names = {first: "plan", **{m: f"plan-{m}" for m in rest}}
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": facts,
        "profiles": runs,
        "bench": {
            "seconds": round(time.monotonic() - bench_began, 1),
            "repeats": args.repeats,
            "loadavg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "results": [r.to_dict() for r in results],
        },
        "tables": {m: rows(results, names[m], profiles[m], args.cpus) for m in modes},
        "seconds": round(time.monotonic() - began, 1),
    }
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    text = "\n\n".join(table(m, report["tables"][m]) for m in modes)
    text += (
        f"\n\n{args.model} on {args.cpus} cores; bench load average "
        f"{report['bench']['loadavg']}; whole run {report['seconds']} s\n"
    )
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
