"""What the profiler's isolation checks report on a quiet machine and beside a busy core.

Issue 11: a profile measured on cores that are not exclusive must be flagged or re-measured,
never silently stored. This runs the real ``packrat profile`` (one fresh pinned process per
point, the isolation calibration, the monotonicity re-measurements) in alternating order:

- ``quiet``: nothing else pinned to the profiled cores;
- ``busy``: a spin loop pinned to the last profiled core for the whole run;

each with ``--allow-contended`` so that both profiles are written and can be compared point
by point; then one ``busy`` run without it, which must refuse to store the profile (exit code
and the one-line reason are recorded). It reports, per point, the quiet and busy latencies
(medians over the rounds) and their ratio, and per run what the checks found: the spare
share of each core, CPU pressure, the suspects re-measured and the verdict.

Run: ``.venv/bin/python benchmarks/profiling/profile_isolation.py --model resnet50 --max-batch 8``
(about 5 minutes on 2 cores). Results: ``benchmarks/results/profile-isolation-<model>.json``
and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Do profiles hold beside busy neighbours?"'
    " (#do-profiles-hold-beside-busy-neighbours)"
)

RESULTS = Path(__file__).resolve().parents[1] / "results"
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
PACKRAT = [sys.executable, "-m", "packrat"]


def profile(
    model: str, cpus: int, max_batch: int, out: Path, *, busy_core: int | None, allow: bool
) -> dict[str, Any]:
    """One real ``packrat profile`` run; the busy loop (if any) lives exactly as long."""
    hog = (
        subprocess.Popen([sys.executable, "-c", BUSY, str(busy_core)])
        if busy_core is not None
        else None
    )
    cmd = [*PACKRAT, "profile", "--model", model, "--cpus", str(cpus)]
    cmd += ["--max-batch", str(max_batch), "-o", str(out)]
    if allow:
        cmd.append("--allow-contended")
    env = {k: v for k, v in os.environ.items() if k != "PACKRAT_ALLOW_CONTENDED"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    wall = time.monotonic() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    run: dict[str, Any] = {
        "busy_core": busy_core,
        "allow_contended": allow,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "last_line": lines[-1] if lines else "",
        "stored": out.exists(),
    }
    if out.exists():
        data = json.loads(out.read_text())
        run["points"] = {f"t{p['threads']}b{p['batch']}": p["latency_ms"] for p in data["points"]}
        isolation = data["meta"]["extra"].get("isolation", {})
        run["isolation"] = {
            k: isolation.get(k)
            for k in (
                "quiet",
                "exclusive",
                "spare_share",
                "busy_cores",
                "pressure_some_avg10",
                "procs_running",
                "remeasured",
                "suspects",
                "contaminated",
                "reasons",
            )
        }
        out.unlink()
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="quiet/busy pairs, alternating")
    args = ap.parse_args(argv)
    busy_core = args.cpus - 1
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = [None, busy_core] if i % 2 == 0 else [busy_core, None]
            for core in order:
                label = "busy" if core is not None else "quiet"
                run = profile(
                    args.model,
                    args.cpus,
                    args.max_batch,
                    Path(tmp) / f"{label}-{i}.json",
                    busy_core=core,
                    allow=True,
                )
                runs.append({"label": label, "round": i, **run})
                print(f"{label} round {i}: exit {run['exit_code']}, {run['wall_s']} s", flush=True)
        refused = profile(
            args.model,
            args.cpus,
            args.max_batch,
            Path(tmp) / "refused.json",
            busy_core=busy_core,
            allow=False,
        )
    report = {"model": args.model, "cpus": args.cpus, "runs": runs, "refused": refused}
    text = render(report)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"profile-isolation-{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".txt").write_text(text + "\n")
    return 0


def render(report: dict[str, Any]) -> str:
    runs = report["runs"]
    by = {
        label: [r["points"] for r in runs if r["label"] == label and "points" in r]
        for label in ("quiet", "busy")
    }
    keys = sorted(
        {k for pts in by["quiet"] + by["busy"] for k in pts},
        key=lambda k: (int(k[1 : k.index("b")]), int(k[k.index("b") + 1 :])),
    )
    out = [f"{'point':>8} {'quiet ms':>10} {'busy ms':>10} {'busy/quiet':>10}"]
    for key in keys:
        q = [p[key] for p in by["quiet"] if key in p]
        b = [p[key] for p in by["busy"] if key in p]
        if q and b:
            qm, bm = statistics.median(q), statistics.median(b)
            out.append(f"{key:>8} {qm:>10.2f} {bm:>10.2f} {bm / qm:>9.2f}x")
    out.append("")
    for r in runs:
        iso = r.get("isolation") or {}
        share = iso.get("spare_share") or {}
        shares = ", ".join(f"cpu {c}: {s:.2f}" for c, s in share.items())
        out.append(
            f"{r['label']:>5} round {r['round']}: quiet={iso.get('quiet')} "
            f"contaminated={iso.get('contaminated')} spare share [{shares}] "
            f"psi={iso.get('pressure_some_avg10')} "
            f"re-measured={sorted(iso.get('remeasured') or {})} "
            f"wall {r['wall_s']} s"
        )
    refused = report["refused"]
    out.append(
        f"busy, without --allow-contended: exit {refused['exit_code']}, "
        f"stored={refused['stored']}: {refused['last_line']}"
    )
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
