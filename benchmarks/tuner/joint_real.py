"""Plan and replicas adapting together on real pods: a 4x arrival-rate step (issue 27 item 4).

The sibling of ``tuner_experiment.py`` (same harness: the real operator against the kmock
emulator, real ``packrat serve`` pods started by the integration harness's agent, Service
traffic through its kube-proxy stand-in, open-loop Poisson arrivals sent by ``run_trace``),
with configurations run **interleaved** in one run (A B C A B C ...), each trial on a fresh
PackratModel with the same spec but for ``spec.autoBatch``:

- ``fixed``: ``spec.slo`` (planned on a steady sample at the base rate: the planner does
  not know about the step) and ``spec.autoscaling`` (the envelope tuner with start-up
  headroom); the plan inside a replica is the planner's;
- ``joint``: plus ``spec.autoBatch`` with the slow rules (3 observations 5 s apart, 60 s
  between switches, 5% expected gain; floored at the planner's batch, the tuner counting no
  more per replica than the planned plan serves): ``sustainSeconds: 0``, the operator's
  default when the committed runs were made;
- ``joint-fast``: plus ``sustainSeconds: 1`` (the fast trigger, the default since).

Every trial of one repeat replays the same arrivals (base rate, ``--factor`` times it, back).
The profile is measured once by a real profiling Job (the first trial) or read from
``--profile``, and seeded into every later model (so the plans do not differ by profiling
noise). Sampled every 0.5 s: the tuner's replicas (``status.autoscaling.replicas``), the
model's running and ready pods (the agent's), the plan served (``status.plan``); every 1 s
each ready pod's ``/status`` (its batch-size estimate, the outstanding requests). Per trial
and phase: requests, failed, misses (failed + over the SLO), P99, cores (running pods x
``spec.cpus`` integrated over the phase), the plan switches with their times
(``status.switchHistory``, in-pod included), the first scale-up after the step; per
configuration the medians and ranges over the repeats. Outputs: ``benchmarks/results/
<stem>.json.gz`` (everything; the requests as ``[sent s, latency ms, status]``) and
``<stem>.txt``; ``--merge A.json.gz B.json.gz`` reports several runs' trials as one.

On this machine every pod, the operator, the emulator and the load generator share two
cores: a second replica adds no CPU, only a second queue. The numbers show the control loops
(when they act, whether they fight, what the pods saw); they cannot show the capacity a real
node's extra cores would add.

Run (under ``flock /work/bench.lock``): ``.venv/bin/python benchmarks/tuner/joint_real.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))

from harness import OperatorCluster, wait_for  # noqa: E402
from seeding import seed_profile  # noqa: E402

from packrat.bench.loadgen import Target  # noqa: E402
from packrat.bench.replay import run_trace  # noqa: E402
from packrat.controller.serving import manifests as m  # noqa: E402
from packrat.plan.des import nearest_rank  # noqa: E402
from packrat.plan.profile import parse_profile  # noqa: E402
from packrat.plan.traces import gamma_trace  # noqa: E402
from packrat.serve.codec import example_body  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the tuner follow a load step?"'
    " (#how-does-the-tuner-follow-a-load-step)"
)

RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ("fixed", "joint", "joint-fast")
# a shared machine: the profiler's isolation check would refuse every profile (as in the tests)
os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")


def spec_for(config: str, args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"zoo": args.model},
        "cpus": args.cpus,
        "maxBatchDelayMs": args.max_delay,
        "profiling": {
            "maxBatch": args.max_batch,
            "threads": [1, 2] if args.cpus >= 2 else [1],
            "precision": 0.2,
            "timeBudgetSeconds": args.profile_budget,
            "backoffLimit": 1,
        },
        "switch": {"readyTimeoutSeconds": 180, "drainSeconds": 2},
        "slo": {"latencyP99Ms": args.slo, "rate": args.rate, "durationSeconds": 60},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": args.max_replicas,
            "scaleDownDelaySeconds": args.scale_down_delay,
            "intervalSeconds": 2,
            "startupFloorSeconds": args.startup_floor,
        },
    }
    if config in ("joint", "joint-fast"):
        # the operator's default rules; the range up to the profile's largest batch (the
        # operator refuses more)
        spec["autoBatch"] = {
            "max": args.max_batch,
            "sustainSeconds": 1 if config == "joint-fast" else 0,
        }
    elif config != "fixed":
        raise ValueError(config)
    return spec


def arrivals(args: argparse.Namespace, seed: int) -> np.ndarray:
    """Poisson arrivals: ``--base`` s at the base rate, ``--step`` s at ``--factor`` times it,
    ``--after`` s back at the base rate."""
    parts, start = [], 0.0
    for i, (rate, span) in enumerate(
        [(args.rate, args.base), (args.rate * args.factor, args.step), (args.rate, args.after)]
    ):
        parts.append(gamma_trace(rate, cv=1.0, duration_s=span, seed=seed * 10 + i) + start)
        start += span
    return np.concatenate(parts)


def phases(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    b, s, a = args.base, args.step, args.after
    return [("base", 0.0, b), ("step", b, b + s), ("after", b + s, b + s + a)]


def _pod_status(cluster: OperatorCluster, pod: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{cluster.agent.proxy.pod_url(pod)}/status", timeout=2) as r:
            doc = json.loads(r.read(1 << 20))
    except (OSError, ValueError):
        return None
    est = doc.get("batch_size_estimate") or {}
    out = doc.get("outstanding") or {}
    return {
        "pod": pod,
        "estimate": est.get("estimate"),
        "ewma": est.get("ewma"),
        "in_flight": out.get("in_flight"),
        "queued": out.get("queued"),
        "batches": est.get("batches"),
    }


def watch(
    cluster: OperatorCluster, name: str, t0: float, stop: threading.Event
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Samples (status and the agent's pods every 0.5 s; the pods' /status every 1 s) in a
    thread, until ``stop``; returns the growing lists."""
    samples: list[dict[str, Any]] = []
    pods_seen: list[dict[str, Any]] = []

    def run() -> None:
        tick = 0
        while not stop.is_set():
            now = time.monotonic() - t0
            try:
                status = cluster.status(name)
            except AssertionError:
                break
            mine = [
                p
                for p in list(cluster.agent.pods.values())
                if p.owner_name.startswith(f"{name}-") and p.owner_kind != "Job"
            ]
            running = [p for p in mine if p.phase == "Running" and not p.terminating]
            ready = [p for p in running if p.ready]
            auto = status.get("autoscaling") or {}
            samples.append(
                {
                    "t": round(now, 3),
                    "wanted": auto.get("replicas"),
                    "running": len(running),
                    "ready": len(ready),
                    "plan": (status.get("plan") or {}).get("label"),
                    "batch": (status.get("plan") or {}).get("batch"),
                    "observed": (status.get("batchSize") or {}).get("observed"),
                    "action": (auto.get("lastDecision") or {}).get("action"),
                    "scale": "{time} {reason}".format(**auto["lastScale"])
                    if isinstance(auto.get("lastScale"), dict)
                    else None,
                    "decision": ((status.get("batchSize") or {}).get("lastDecision") or {}).get(
                        "message"
                    ),
                }
            )
            if tick % 2 == 0:
                for p in ready:
                    got = _pod_status(cluster, p.name)
                    if got is not None:
                        pods_seen.append({"t": round(time.monotonic() - t0, 3), **got})
            tick += 1
            stop.wait(0.5)

    threading.Thread(target=run, daemon=True).start()
    return samples, pods_seen


def load_process(job: dict[str, Any], trace: np.ndarray, out: Path) -> dict[str, Any]:
    """Sends ``trace`` from a process of its own (this one's GIL serves the emulator, the
    agent and the samplers: an in-process generator fell 0.9 s behind at 400/s) and waits
    for it; its rows ``[sent s, latency ms, status]``, ``origin`` (its CLOCK_MONOTONIC at
    the first send, shared by the processes of one machine) and its worst send lag."""
    np.save(out.with_suffix(".npy"), trace)
    job = {**job, "trace": str(out.with_suffix(".npy")), "out": str(out.with_suffix(".json"))}
    subprocess.run([sys.executable, __file__, "--load-only", json.dumps(job)], check=True)
    return dict(json.loads(out.with_suffix(".json").read_text()))


def _load_only(job: dict[str, Any]) -> None:
    origin = time.monotonic()
    result = asyncio.run(
        run_trace(
            Target(url=job["url"], model=job["model"], body=example_body(job["zoo"]), timeout_s=30),
            arrivals_s=np.load(job["trace"]).tolist(),
        )
    )
    rows = [[round(r.sent_s, 4), round(r.latency_s * 1000.0, 2), r.status] for r in result.records]
    doc = {"origin": origin, "rows": rows, "send_lag_ms": round(result.late_s * 1000.0, 1)}
    Path(job["out"]).write_text(json.dumps(doc))


def wait_ready(cluster: OperatorCluster, name: str, timeout: float) -> None:
    def ready() -> bool:
        status = cluster.status(name)
        if status.get("phase") == "Failed":
            raise RuntimeError(f"{name} Failed: {json.dumps(status)[:2000]}")
        return bool(status.get("phase") == "Ready")

    wait_for(
        ready,
        timeout=timeout,
        what=f"{name} Ready",
        period=1.0,
        detail=lambda: json.dumps(cluster.status(name))[:2000] + cluster.log_tail(),
    )


def trial(
    cluster: OperatorCluster,
    args: argparse.Namespace,
    *,
    config: str,
    repeat: int,
    profile: str | None,
) -> tuple[dict[str, Any], str]:
    """One configuration's trial; its record, and the profile it served from (JSON)."""
    name = f"{config}-{repeat}"
    spec = spec_for(config, args)
    body = {"apiVersion": "packrat.dev/v1alpha1", "kind": "PackratModel"}
    cluster.api.create("packratmodels", {**body, "metadata": {"name": name}, "spec": spec})
    if profile is not None:
        seed_profile(cluster, name, parse_profile(profile, origin="--profile"))
    wait_ready(cluster, name, timeout=600 if profile is None else 240)
    ready_status = cluster.status(name)
    cm = cluster.api.get("configmaps", ready_status["profile"]["configMap"])
    assert cm is not None
    used = str(cm["data"][m.PROFILE_FILE])
    trace = arrivals(args, seed=100 + repeat)
    load_before = os.getloadavg()
    stop = threading.Event()
    t0 = time.monotonic()
    samples, pods_seen = watch(cluster, name, t0, stop)
    job = {"url": cluster.agent.proxy.url(name), "model": name, "zoo": args.model}
    load = load_process(job, trace, cluster.workdir / f"load-{name}")
    time.sleep(args.tail)
    stop.set()
    final = cluster.status(name)
    load_after = os.getloadavg()
    cluster.api.delete("packratmodels", name)
    wait_for(
        lambda: not any(p.owner_name.startswith(f"{name}-") for p in cluster.agent.pods.values()),
        timeout=120,
        what=f"{name}'s pods gone",
    )
    rows = load["rows"]  # seconds from the first send; the samples likewise from here on
    shift = load["origin"] - t0
    time.sleep(0.6)  # the watcher's last sample
    for sample in [*samples, *pods_seen]:
        sample["t"] = round(sample["t"] - shift, 3)
    record = {
        "config": config,
        "repeat": repeat,
        "provisioning": ready_status.get("provisioning"),
        "plan_at_start": (ready_status.get("plan") or {}).get("label"),
        "switch_history": final.get("switchHistory") or [],
        "batch_size": final.get("batchSize"),
        "final_autoscaling": final.get("autoscaling"),
        "send_lag_ms": load["send_lag_ms"],
        "loadavg": [round(x, 2) for x in (*load_before, *load_after)],
        "samples": samples,
        "pods": pods_seen,
        "rows": rows,
    }
    record["summary"] = summarize_trial(record, args)
    return record, used


def _integral(samples: list[dict[str, Any]], key: str, lo: float, hi: float) -> float:
    """The step function ``key`` (held from each sample to the next) integrated over [lo, hi)."""
    total = 0.0
    for here, nxt in zip(samples, [*samples[1:], None], strict=True):
        start = max(lo, here["t"])
        end = min(hi, nxt["t"] if nxt is not None else hi)
        if end > start:
            total += float(here[key] or 0) * (end - start)
    return total


def summarize_trial(record: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rows, samples, pods = record["rows"], record["samples"], record["pods"]
    cpus = int((record.get("provisioning") or {}).get("cpusPerReplica") or args.cpus)
    out: dict[str, Any] = {"cpus_per_replica": cpus}
    for phase, lo, hi in phases(args):
        sel = [r for r in rows if lo <= r[0] < hi]
        ok = np.array([r[1] for r in sel if r[2] == 200])
        failed = sum(1 for r in sel if r[2] != 200)
        misses = failed + int((ok > args.slo).sum())
        est = [p["estimate"] for p in pods if lo <= p["t"] < hi and p["estimate"] is not None]
        depth = [(p["in_flight"] or 0) + (p["queued"] or 0) for p in pods if lo <= p["t"] < hi]
        out[phase] = {
            "requests": len(sel),
            "failed": failed,
            "misses": misses,
            "miss_pct": round(100.0 * misses / max(1, len(sel)), 2),
            "p99_ms": round(nearest_rank(np.array([*ok, *([np.inf] * failed)]), 99), 1)
            if sel
            else None,
            "cores": round(cpus * _integral(samples, "running", lo, hi), 1),
            "ready_replica_s": round(_integral(samples, "ready", lo, hi), 1),
            "wanted_max": max((s["wanted"] or 0 for s in samples if lo <= s["t"] < hi), default=0),
            "estimate_max": max(est, default=None),
            "estimate_counts": {str(v): est.count(v) for v in sorted(set(est))},
            "depth_max": max(depth, default=None),
        }
    base_end = args.base
    before = [s for s in samples if s["t"] < base_end]
    start_wanted = (before[-1]["wanted"] if before else samples[0]["wanted"]) or 0
    ups = [s for s in samples if s["t"] >= base_end and (s["wanted"] or 0) > start_wanted]
    out["first_scale_up_s"] = round(ups[0]["t"] - base_end, 1) if ups else None
    start_ready = (before[-1]["ready"] if before else 0) or 0
    readies = [s for s in samples if s["t"] >= base_end and s["ready"] > start_ready]
    out["first_ready_up_s"] = round(readies[0]["t"] - base_end, 1) if readies else None
    switches = []
    for prev, here in itertools.pairwise(samples):
        if here["plan"] != prev["plan"] and prev["plan"] is not None:
            switches.append({"t": here["t"], "from": prev["plan"], "to": here["plan"]})
    out["plan_changes"] = switches
    out["switches"] = [
        {k: h.get(k) for k in ("time", "fromBatch", "toBatch", "mode", "result", "seconds")}
        for h in record["switch_history"]
    ]
    out["replicas"] = _changes(samples, ("wanted", "running", "ready"))
    out["scales"] = sorted({s["scale"] for s in samples if s.get("scale")})
    out["decisions"] = [[t, d] for t, d in _changes(samples, ("decision",)) if d]
    total = rows
    failed = sum(1 for r in total if r[2] != 200)
    miss = failed + sum(1 for r in total if r[2] == 200 and r[1] > args.slo)
    out["all"] = {
        "requests": len(total),
        "failed": failed,
        "misses": miss,
        "miss_pct": round(100.0 * miss / max(1, len(total)), 2),
    }
    return out


def _changes(samples: list[dict[str, Any]], keys: tuple[str, ...]) -> list[list[Any]]:
    """(t, values...) whenever one of ``keys`` changes: replicas over time, compactly."""
    out: list[list[Any]] = []
    last = None
    for s in samples:
        values = [s[k] for k in keys]
        if values != last:
            out.append([s["t"], *values])
            last = values
    return out


def _spread(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    med = statistics.median(got)
    return f"{med:g} ({min(got):g}-{max(got):g})" if len(got) > 1 else f"{med:g}"


def report(records: list[dict[str, Any]], args: argparse.Namespace, command: str) -> str:
    loads = [x for r in records for x in r["loadavg"][0:1] + r["loadavg"][3:4]] or [float("nan")]
    lines = [
        f"joint adaptation on real pods: {args.model}, spec.cpus {args.cpus} (the planner chose "
        f"{sorted({r['summary']['cpus_per_replica'] for r in records})} per replica), Poisson "
        f"{args.rate:g}/s for {args.base:g} s -> x{args.factor:g} for {args.step:g} s -> "
        f"{args.rate:g}/s for {args.after:g} s; SLO P99 {args.slo:g} ms (planned on a steady "
        f"{args.rate:g}/s sample), maxReplicas {args.max_replicas}, scale-down delay "
        f"{args.scale_down_delay} s; configurations interleaved, {args.repeats} repeats; "
        f"load average (1 min) {min(loads):.1f}-{max(loads):.1f} on 2 shared cores",
        f"command: {command}",
        "",
        "per trial (phase: requests / misses (failed) / P99 ms / cores = replica-s x cpus; "
        "max pod estimate)",
    ]
    for r in records:
        s = r["summary"]
        cells = [
            f"{p}: {s[p]['requests']} / {s[p]['misses']} ({s[p]['failed']}) / {s[p]['p99_ms']} / "
            f"{s[p]['cores']}; est {s[p]['estimate_max']}"
            for p, _, _ in phases(args)
        ]
        sw = ", ".join(
            f"{c['from']}->{c['to']} at {c['t'] - args.base:+.1f}" for c in s["plan_changes"]
        )
        reps = " ".join(f"{t - args.base:+.0f}s:{w}/{ru}/{rd}" for t, w, ru, rd in s["replicas"])
        lines.append(
            f"{r['config']:>10} #{r['repeat']} plan {r['plan_at_start']}: " + " | ".join(cells)
        )
        lines.append(
            f"{'':>13}first scale-up {s['first_scale_up_s']} s after the step (ready +1 at "
            f"{s['first_ready_up_s']} s); plan changes (s from the step): {sw or 'none'}; "
            f"replicas wanted/running/ready: {reps}; send lag {r['send_lag_ms']} ms"
        )
    lines += [
        "",
        "medians (min-max) over repeats",
        "config | step misses % | all misses % | step P99 ms | after P99 ms | "
        "cores base/step/after | plan switches | first scale-up s | step max estimate",
        "---|---|---|---|---|---|---|---|---",
    ]
    for config in args.configs:
        mine = [r["summary"] for r in records if r["config"] == config]
        if not mine:
            continue
        cores = "/".join(_spread([s[p]["cores"] for s in mine]) for p, _, _ in phases(args))
        lines.append(
            f"{config} | {_spread([s['step']['miss_pct'] for s in mine])} | "
            f"{_spread([s['all']['miss_pct'] for s in mine])} | "
            f"{_spread([s['step']['p99_ms'] for s in mine])} | "
            f"{_spread([s['after']['p99_ms'] for s in mine])} | {cores} | "
            f"{_spread([len(s['plan_changes']) for s in mine])} | "
            f"{_spread([s['first_scale_up_s'] for s in mine])} | "
            f"{_spread([s['step']['estimate_max'] for s in mine])}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--load-only"]:
        _load_only(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--base", type=float, default=20.0, help="seconds at the base rate")
    parser.add_argument("--step", type=float, default=40.0, help="seconds at the step's rate")
    parser.add_argument("--after", type=float, default=20.0, help="seconds back at the base")
    parser.add_argument("--tail", type=float, default=3.0, help="seconds watched after the load")
    parser.add_argument("--slo", type=float, default=1000.0)
    parser.add_argument("--max-delay", type=int, default=5, help="spec.maxBatchDelayMs")
    parser.add_argument("--max-batch", type=int, default=8, help="profiling maxBatch")
    parser.add_argument("--profile-budget", type=int, default=120)
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument("--scale-down-delay", type=int, default=30)
    parser.add_argument("--startup-floor", type=int, default=0)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--first-repeat", type=int, default=1, help="the first repeat's number (its seed)"
    )
    parser.add_argument(
        "--rotate",
        action="store_true",
        help="rotate the configurations' order each repeat (A B C, B C A, ...): no fixed place",
    )
    parser.add_argument("--profile", type=Path, help="a profile JSON to seed (else measured)")
    parser.add_argument("--stem", default="joint-real")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="only report: the trials of these saved runs (same parameters) as one",
    )
    args = parser.parse_args()
    args.configs = args.configs.split(",")
    command = "python benchmarks/tuner/joint_real.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.merge:
        trials = [
            t for f in args.merge for t in json.loads(gzip.decompress(f.read_bytes()))["trials"]
        ]
        for t in trials:  # summarised again: a changed summary applies to old runs too
            t["summary"] = summarize_trial(t, args)
        text = report(trials, args, command)
        text += "merged from: " + ", ".join(str(f.name) for f in args.merge) + "\n"
        (RESULTS / f"{args.stem}.txt").write_text(text)
        print(text)
        return
    profile = args.profile.read_text() if args.profile is not None else None
    records: list[dict[str, Any]] = []
    began = time.monotonic()
    # a time limit's SIGTERM ends the run through ``finally``: the trials done are written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated: the trials done so far"))
    with tempfile.TemporaryDirectory(prefix="packrat-joint-") as tmp:
        cluster = OperatorCluster(Path(tmp), inpod_switch=True)
        try:
            for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
                shift = (repeat - args.first_repeat) % len(args.configs) if args.rotate else 0
                for config in [*args.configs[shift:], *args.configs[:shift]]:
                    print(f"[{time.monotonic() - began:.0f}s] {config} #{repeat}", flush=True)
                    record, used = trial(
                        cluster, args, config=config, repeat=repeat, profile=profile
                    )
                    if profile is None:
                        profile = used
                        (RESULTS / f"{args.stem}-profile.json").write_text(used)
                    records.append(record)
                    print(json.dumps(record["summary"], default=str)[:1500], flush=True)
        finally:
            if cluster.agent.errors:
                print("agent errors:", cluster.agent.errors[-5:])
            cluster.close()
            text = report(records, args, command)
            text += f"total {time.monotonic() - began:.0f} s\n"
            doc = {"args": {k: str(v) for k, v in vars(args).items()}, "trials": records}
            with gzip.open(RESULTS / f"{args.stem}.json.gz", "wt") as out:
                out.write(json.dumps(doc) + "\n")
            (RESULTS / f"{args.stem}.txt").write_text(text)
            print(text)


if __name__ == "__main__":
    main()
