"""Online reconfiguration, measured: auto-reconfiguring Packrat vs static plans under a load step.

Packrat's claim for its online half is that following the load (re-planning for the batch size
the arrivals form, switching slots without downtime) serves every phase of a diurnal load about
as well as the plan tuned for that phase, never drops a request and never flaps. This script
runs the real operator against the kmock emulator with the integration harness's test agent
(real ``packrat serve`` processes, Service traffic through its kube-proxy stand-in) and drives
the same stepped closed-loop load, concurrency 2 -> 8 -> 16 -> 8 -> 2, against three
PackratModels one after another:

- ``auto``: ``spec.autoBatch`` {min 1, max 16}: the operator re-plans online (``auto-floor``
  and ``auto-nearest``: the same with the pods' batch-size estimate rounding set;
  ``auto-fast``: with the fast trigger, ``sustainSeconds: 1``);
- ``fat``: one instance with all T threads, batch 16 (a profile with only t=T points);
- ``mean``: the optimizer's plan for the mean load (batch 8), static.

All three use the same profile (measured once by a real profiling Job, then copied into the
other models' profile ConfigMaps, so the comparison is not confounded by profiling noise).
Per-request latency and status are recorded over time with the switch times (switch start and
Service moved, sampled from status). Outputs under ``benchmarks/results/``: ``<stem>.csv``
(one row per request), ``<stem>-switches.csv``, ``<stem>.png`` (latency over time with switch
markers) and ``<stem>.txt`` (the table: mean and p99 latency per phase and configuration,
failed requests, switches).

It is a benchmark, not a test: one run of each configuration on a shared machine; read the
numbers with that in mind. With the tiny model, latency is dominated by HTTP and Python
overhead (client, proxy, dispatcher, TorchServe), so the comparison mainly shows correctness
(zero failures, switches only at real load changes), not Packrat's speedup.

Run: ``.venv/bin/python benchmarks/reconfig/reconfig_experiment.py`` (about 6 minutes with the
defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))

from harness import OperatorCluster, wait_for  # noqa: E402
from seeding import seed_profile  # noqa: E402

from packrat.controller.serving import manifests as m  # noqa: E402
from packrat.plan.profile import parse_profile  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Does following the load (autoBatch) beat a static plan?"'
    " (#does-following-the-load-autobatch-beat-a-static-plan)"
)

RESULTS = ROOT / "benchmarks" / "results"
ROUNDED = ("auto-nearest", "auto-floor")
PROFILING: dict[str, Any] = {
    "maxBatch": 16,
    "threads": [1, 2],
    "precision": 0.2,
    "timeBudgetSeconds": 40,
    "backoffLimit": 1,
}


def spec_for(
    config: str,
    *,
    model: str,
    cpus: int,
    sustain: int,
    interval: int,
    profiling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    profiling = dict(PROFILING if profiling is None else profiling)
    spec: dict[str, Any] = {
        "model": {"zoo": model},
        "cpus": cpus,
        "maxBatchDelayMs": 5,
        "profiling": profiling,
        "switch": {"readyTimeoutSeconds": 180, "drainSeconds": 2},
    }
    if config in ("auto", "auto-nearest", "auto-floor", "auto-fast"):
        spec["autoBatch"] = {
            "min": 1,
            "max": 16,
            "sustainObservations": sustain,
            "minIntervalSeconds": interval,
            "minGain": 0.05,
            **({"rounding": config.removeprefix("auto-")} if config in ROUNDED else {}),
            # the fast trigger: an estimate every pod has held 1 s, read every second
            **({"sustainSeconds": 1} if config == "auto-fast" else {}),
        }
    elif config == "fat":
        spec["batchSize"] = 16
        spec["profiling"] = {**profiling, "threads": [cpus]}  # only t=T: one fat instance
    elif config == "mean":
        spec["batchSize"] = 8  # the mean concurrency of the schedule, 7.2, as a power of two
    else:
        raise ValueError(config)
    return spec


async def _bursts(url: str, schedule: list[tuple[str, int, float]], out: Path, *, zoo: str) -> None:
    """The load process: closed-loop bursts of B concurrent requests, B following the schedule
    (one burst at a time; the next starts when the last answer of the previous arrived)."""
    import aiohttp

    from packrat.serve.codec import example_body

    body = example_body(zoo)  # the zoo model's example input, as `packrat loadgen` sends it
    rows: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(phase: str, burst: int) -> None:
            start = time.monotonic()
            try:
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/octet-stream"}
                ) as resp:
                    text = await resp.text()
                    code = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                code, text = 0, repr(exc)
            rows.append(
                {
                    "t": start,  # CLOCK_MONOTONIC: shared by the processes of one machine
                    "latency_ms": round((time.monotonic() - start) * 1000.0, 3),
                    "code": code,
                    "phase": phase,
                    "concurrency": burst,
                    "error": "" if code == 200 else text[:120],
                }
            )

        end = 0.0
        for phase, burst, seconds in schedule:
            end += seconds
            while time.monotonic() - t0 < end:
                await asyncio.gather(*(one(phase, burst) for _ in range(burst)))
    out.write_text(json.dumps(rows))


def load_process(
    url: str, schedule: list[tuple[str, int, float]], out: Path, *, zoo: str
) -> subprocess.Popen[bytes]:
    """Starts the load in its own process (this one's GIL serves the emulator and the agent)."""
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--load-only",
            json.dumps({"url": url, "schedule": schedule, "out": str(out), "zoo": zoo}),
        ]
    )


def pod_estimates(cluster: OperatorCluster, name: str) -> list[int]:
    """The batch-size estimate each running pod of ``name`` reports on its ``/status`` now."""
    out = []
    for pod in list(cluster.agent.pods.values()):
        if not pod.owner_name.startswith(f"{name}-") or pod.phase != "Running" or not pod.port:
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{pod.port}/status", timeout=2) as r:
                out.append(int(json.loads(r.read())["batch_size_estimate"]["estimate"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out)


def watch_status(
    cluster: OperatorCluster, name: str, t0: float, stop: threading.Event
) -> list[dict[str, Any]]:
    """Samples status (and the pods' own estimates) every 0.1 s in a thread; returns the
    (growing) list of samples."""
    samples: list[dict[str, Any]] = []

    def run() -> None:
        while not stop.is_set():
            try:
                status = cluster.status(name)
            except AssertionError:
                break
            samples.append(
                {
                    "t": time.monotonic() - t0,
                    "pods": pod_estimates(cluster, name),
                    "slot": status.get("activeSlot"),
                    "switching": bool(status.get("switch"))
                    and (status.get("switch") or {}).get("stage") in ("rollout", "draining"),
                    "plan_batch": (status.get("plan") or {}).get("batch"),
                    "label": (status.get("plan") or {}).get("label"),
                    "observed": (status.get("batchSize") or {}).get("observed"),
                    "target": (status.get("batchSize") or {}).get("target"),
                    # the fast trigger's evidence when it decided ("estimate 8 held 1.1s ...")
                    "fast": ((status.get("batchSize") or {}).get("lastDecision") or {}).get("fast"),
                    "decision": ((status.get("batchSize") or {}).get("lastDecision") or {}).get(
                        "outcome"
                    ),
                }
            )
            stop.wait(0.1)

    threading.Thread(target=run, daemon=True).start()
    return samples


def switch_events(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Switch start (status.switch appears) and Service moved (activeSlot changes) times, and
    in-pod switches (the plan changes on the same slot, no switch under way)."""
    events = []
    for before, after in itertools.pairwise(samples):
        if after["switching"] and not before["switching"]:
            events.append({"t": after["t"], "event": "switch_started", "plan": after["label"]})
        if after["slot"] != before["slot"] and before["slot"] is not None:
            events.append({"t": after["t"], "event": "service_moved", "plan": after["label"]})
        elif (
            after["slot"] == before["slot"] is not None
            and after["label"] != before["label"]
            and before["label"] is not None
            and not after["switching"]
        ):
            events.append({"t": after["t"], "event": "switched_in_pod", "plan": after["label"]})
    return events


def reactions(
    rows: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    events: list[dict[str, Any]],
    schedule: list[tuple[str, int, float]],
) -> list[dict[str, Any]]:
    """Per load change of one configuration: seconds from the new phase's first request to
    the pods' estimate changing (every pod reporting a value other than the one it held
    when the phase began), and to the plan switched (the first switch seen in status within
    the phase); None where it did not happen within the phase."""
    starts: dict[str, float] = {}
    for row in rows:
        starts[row["phase"]] = min(starts.get(row["phase"], math.inf), row["t"])
    names = [phase for phase, _, _ in schedule if phase in starts]
    out = []
    for phase, nxt in zip(names[1:], [*names[2:], None], strict=True):
        start, end = starts[phase], starts[nxt] if nxt is not None else math.inf
        held: list[int] = next(
            (s["pods"] for s in reversed(samples) if s["t"] < start and s["pods"]), []
        )
        moved = next(
            (
                s["t"]
                for s in samples
                if start <= s["t"] < end and s["pods"] and not set(s["pods"]) & set(held)
            ),
            None,
        )
        switched = next(
            (e["t"] for e in events if start <= e["t"] < end and e["event"] != "switch_started"),
            None,
        )
        decided = next(
            (
                after["t"]
                for before, after in itertools.pairwise(samples)
                if start <= after["t"] < end and after["target"] != before["target"]
            ),
            None,
        )
        out.append(
            {
                "phase": phase,
                "estimate_s": None if moved is None else round(moved - start, 2),
                "decided_s": None if decided is None else round(decided - start, 2),
                "switched_s": None if switched is None else round(switched - start, 2),
            }
        )
    return out


def copy_profile(cluster: OperatorCluster, *, source: str, name: str, threads: list[int]) -> None:
    """Seed the model ``name``'s profile ConfigMap, owned by it, from the profile JSON
    ``source`` (only the ``threads`` points), once the operator has keyed it."""
    profile = parse_profile(source, origin="first configuration's profile")
    seed_profile(
        cluster, name, profile.with_points(p for p in profile.points if p.threads in threads)
    )


def run_config(
    cluster: OperatorCluster,
    *,
    config: str,
    spec: dict[str, Any],
    schedule: list[tuple[str, int, float]],
    source: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], str]:
    name = config
    cluster.api.create(
        "packratmodels",
        {
            "apiVersion": "packrat.dev/v1alpha1",
            "kind": "PackratModel",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    if source is not None:
        copy_profile(cluster, source=source, name=name, threads=spec["profiling"]["threads"])
    deadline = time.monotonic() + 300
    while cluster.status(name).get("phase") != "Ready":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not Ready: {cluster.status(name)}\n{cluster.log_tail(20)}")
        status = cluster.status(name)
        if status.get("phase") == "Failed":
            raise RuntimeError(f"{name} Failed: {status}\n{cluster.log_tail(30)}")
        print(f"[{config}] {status.get('phase')}: {status.get('message', '')[:120]}", flush=True)
        time.sleep(5)
    profile_cm = cluster.api.get("configmaps", cluster.status(name)["profile"]["configMap"])
    assert profile_cm is not None
    profile_text = str(profile_cm["data"][m.PROFILE_FILE])
    print(f"[{config}] ready: plan {cluster.status(name)['plan']['label']}", flush=True)
    out = cluster.workdir / f"load-{config}.json"
    url = f"{cluster.agent.proxy.url(name)}/predictions/{name}"
    t0 = time.monotonic()
    proc = load_process(url, schedule, out, zoo=spec["model"]["zoo"])
    stop = threading.Event()
    samples = watch_status(cluster, name, t0, stop)
    total = sum(seconds for _, _, seconds in schedule)
    print(f"[{config}] load {[(p, b) for p, b, _ in schedule]} for {total:.0f}s", flush=True)
    proc.wait(timeout=total + 300)
    stop.set()
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    for row in rows:
        row["t"] = round(row["t"] - t0, 4)
    status = cluster.status(name)
    cluster.api.delete("packratmodels", name)
    try:
        wait_for(
            lambda: (
                not any(p.owner_name.startswith(f"{name}-") for p in cluster.agent.pods.values())
            ),
            timeout=120,
            what=f"{name}'s pods gone",
        )
    except AssertionError as exc:  # the measurement is taken: report it, say so
        print(f"[{config}] warning: {exc}\n{cluster.log_tail(30)}", flush=True)
    for row in rows:
        row["config"] = config
    events = switch_events(samples)
    for event in events:
        event["config"] = config
    status["reactions"] = reactions(rows, samples, events, schedule)
    status["samples"] = samples
    if os.environ.get("PACKRAT_OPERATOR_VERBOSE"):  # the operator's own account, kept
        (RESULTS / f"operator-{config}.log").write_text(
            (cluster.workdir / "operator.log").read_text(errors="replace")
        )
    return rows, events, status, profile_text


def profile_lines(source: str) -> str:
    """The measured profile as a small table: latency (ms) per batch, one column per thread count
    (the profiling Job ran on the same shared cores as everything else)."""
    points = json.loads(source)["points"]
    threads = sorted({int(p["threads"]) for p in points})
    batches = sorted({int(p["batch"]) for p in points})
    by = {(int(p["threads"]), int(p["batch"])): float(p["latency_ms"]) for p in points}
    lines = [
        "profile used by all three (mean ms per batch):",
        "batch | " + " | ".join(f"t={t}" for t in threads),
        "---|" + "---|" * len(threads),
    ]
    for b in batches:
        cells = [f"{by[(t, b)]:.1f}" if (t, b) in by else "" for t in threads]
        lines.append(f"{b} | " + " | ".join(cells))
    return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def table(
    rows: list[dict[str, Any]],
    schedule: list[tuple[str, int, float]],
    configs: list[str],
    switches: dict[str, int],
) -> str:
    lines = [
        "config | phase (clients) | requests | mean ms | p99 ms | failed",
        "---|---|---|---|---|---",
    ]
    for config in configs:
        for phase, concurrency, _ in schedule:
            lat = [
                r["latency_ms"]
                for r in rows
                if r["config"] == config and r["phase"] == phase and r["code"] == 200
            ]
            failed = sum(
                1
                for r in rows
                if r["config"] == config and r["phase"] == phase and r["code"] != 200
            )
            if lat:
                lines.append(
                    f"{config} | {phase} ({concurrency}) | {len(lat)} | "
                    f"{statistics.fmean(lat):.1f} | {percentile(lat, 0.99):.1f} | {failed}"
                )
    lines.append("")
    lines.append("config | requests | failed | switches (completed)")
    lines.append("---|---|---|---")
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        failed = sum(1 for r in mine if r["code"] != 200)
        lines.append(f"{config} | {len(mine)} | {failed} | {switches.get(config, 0)}")
    return "\n".join(lines)


def plot(
    rows: list[dict[str, Any]],
    events: list[dict[str, Any]],
    schedule: list[tuple[str, int, float]],
    configs: list[str],
    path: Path,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(
        len(configs), 1, figsize=(12, 3.2 * len(configs)), sharex=True, squeeze=False
    )
    for ax, config in zip(grid[:, 0], configs, strict=True):
        mine = [r for r in rows if r["config"] == config]
        ok = [r for r in mine if r["code"] == 200]
        bad = [r for r in mine if r["code"] != 200]
        ax.scatter([r["t"] for r in ok], [r["latency_ms"] for r in ok], s=2, alpha=0.35)
        if bad:
            ax.scatter(
                [r["t"] for r in bad], [r["latency_ms"] for r in bad], s=12, c="red", label="failed"
            )
        for phase, concurrency, _ in schedule:  # phases where the load process started them
            times = [r["t"] for r in mine if r["phase"] == phase]
            if times:
                ax.axvline(min(times), color="grey", lw=0.8)
                ax.text(
                    min(times) + 0.5,
                    0.93,
                    f"{phase}: bursts of {concurrency}",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                )
        for event in [e for e in events if e["config"] == config]:
            style = "--" if event["event"] == "switch_started" else "-"
            ax.axvline(event["t"], color="red", ls=style, lw=1)
            if event["event"] in ("service_moved", "switched_in_pod"):
                ax.text(
                    event["t"],
                    0.8,
                    f" {event['plan']}",
                    color="red",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                )
        ax.set_yscale("log")
        ax.set_ylabel(f"{config}\nlatency ms")
    grid[-1, 0].set_xlabel(
        "seconds since the load started (red: switch started --, Service moved or switched in "
        "the pod -)"
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--load-only"]:
        job = json.loads(args_list[1])
        schedule = [(str(p), int(b), float(d)) for p, b, d in job["schedule"]]
        asyncio.run(_bursts(job["url"], schedule, Path(job["out"]), zoo=job["zoo"]))
        return 0
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--phase-seconds", type=float, default=15.0)
    parser.add_argument("--sustain", type=int, default=3)
    parser.add_argument("--min-interval", type=int, default=5)
    parser.add_argument(
        "--profile-budget",
        type=int,
        default=int(PROFILING["timeBudgetSeconds"]),
        help="profiling time budget (s); ResNet-50 needs ~240 to reach batch 16",
    )
    parser.add_argument("--configs", default="auto,fat,mean")
    parser.add_argument(
        "--switch",
        choices=("inpod", "deployment"),
        default="inpod",
        help="how the operator applies a plan change that keeps the cores: inside the running "
        "pods (its default) or by switching slots (packrat operator --no-inpod-switch)",
    )
    parser.add_argument("--stem", default=None)
    args = parser.parse_args(argv)
    profiling = {**PROFILING, "timeBudgetSeconds": args.profile_budget}
    configs = args.configs.split(",")
    stem = args.stem or f"reconfig-{args.model}"
    d = args.phase_seconds
    schedule = [("p1", 2, d), ("p2", 8, d), ("p3", 16, d), ("p4", 8, d), ("p5", 2, d)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    switches: dict[str, int] = {}
    history: dict[str, Any] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reconfig-") as tmp:
        cluster = OperatorCluster(Path(tmp), inpod_switch=args.switch == "inpod")
        try:
            source: str | None = None
            for config in configs:
                spec = spec_for(
                    config,
                    model=args.model,
                    cpus=args.cpus,
                    sustain=args.sustain,
                    interval=args.min_interval,
                    profiling=profiling,
                )
                got, evs, status, cm = run_config(
                    cluster, config=config, spec=spec, schedule=schedule, source=source
                )
                if source is None:
                    source = cm
                    (RESULTS / f"{stem}-profile.json").write_text(cm)
                rows += got
                events += evs
                done = [h for h in status.get("switchHistory") or [] if h["result"] == "Succeeded"]
                switches[config] = len(done)
                history[config] = {
                    "reactions": status["reactions"],
                    "samples": status["samples"],
                    "plan": (status.get("plan") or {}).get("label"),
                    "switchHistory": status.get("switchHistory") or [],
                    "lastDecision": (status.get("batchSize") or {}).get("lastDecision"),
                }
        finally:
            if cluster.agent.errors:
                print("agent errors:", cluster.agent.errors[-5:])
            cluster.close()
    with (RESULTS / f"{stem}.csv").open("w", newline="") as out:
        writer = csv.DictWriter(
            out, fieldnames=["config", "phase", "concurrency", "t", "latency_ms", "code", "error"]
        )
        writer.writeheader()
        writer.writerows(rows)
    with (RESULTS / f"{stem}-switches.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["config", "t", "event", "plan"])
        writer.writeheader()
        writer.writerows(events)
    text = table(rows, schedule, configs, switches)
    header = (
        f"reconfig experiment: model {args.model}, {args.cpus} cpus, closed-loop clients "
        f"{' -> '.join(str(c) for _, c, _ in schedule)}, {d:.0f}s per phase, "
        f"autoBatch sustain {args.sustain}, minInterval {args.min_interval:.0f}s; "
        f"one run per configuration, sequential, on a shared 2-core machine; "
        f"total {time.monotonic() - began:.0f}s\n"
        f"command: .venv/bin/python benchmarks/reconfig/reconfig_experiment.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}\n"
    )
    switch_lines = "\n".join(
        f"{config}: plan {h['plan']}; switches: "
        + "; ".join(
            f"{s.get('fromBatch')}->{s.get('toBatch')} {s.get('mode', 'Deployment')} "
            f"{s.get('result')} ({s.get('seconds')}s)"
            for s in h["switchHistory"]
        )
        + (
            f"; last decision: {h['lastDecision'].get('outcome')}: "
            f"{h['lastDecision'].get('message')}"
            if h.get("lastDecision")
            else ""
        )
        for config, h in history.items()
    )
    reaction_lines = "\n".join(
        f"{config} | {r['phase']} | {r['estimate_s']} | {r.get('decided_s')} | {r['switched_s']}"
        for config, h in history.items()
        for r in h["reactions"]
    )
    held = sorted(
        {
            (config, sample["fast"])
            for config, h in history.items()
            for sample in h["samples"]
            if sample.get("fast")
        }
    )
    held_lines = "\n".join(f"{config}: {fast}" for config, fast in held)
    report = (
        f"{header}\n{text}\n\n{switch_lines}\n\n"
        f"the fast trigger's decisions (how long the estimate had held when it acted):\n"
        f"{held_lines}\n\n"
        "seconds from a phase's first request to every pod's estimate changing, to the "
        "operator's decision (status.batchSize.target) and to the plan switched (status "
        "sampled every 0.1 s; None: not within the phase)\n"
        "config | phase | estimate s | decided s | switched s\n---|---|---|---|---\n"
        f"{reaction_lines}\n"
    )
    (RESULTS / f"{stem}.json").write_text(json.dumps(history, indent=1, default=str))
    if source is not None:
        report += "\n" + profile_lines(source) + "\n"
    (RESULTS / f"{stem}.txt").write_text(report)
    plot(
        rows,
        events,
        schedule,
        configs,
        RESULTS / f"{stem}.png",
        f"Packrat online reconfiguration ({args.model}, {args.cpus} cpus)",
    )
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
