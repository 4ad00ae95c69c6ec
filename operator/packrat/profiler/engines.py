"""Profiling several engines: convert once, check against eager, then measure each engine's
L(t, b) exactly as eager's is measured (co-located, pinned, lockstep rounds).

Each engine other than eager is prepared in its own process
(:mod:`packrat.runtime.engines.prepare`): its artefact is found in the cache folder or
converted into it (keyed by model digest, engine, engine version and input specs), then its
outputs are compared with eager's on the sample input and random batches. An engine whose
extra is missing, whose conversion fails, which crashes or which disagrees is left out of
the profile (no points, so no plan can use it) with its reason in
``meta.extra["engines"]``; the others are profiled one after the other into the same file,
each checkpointed and resumed like eager's points.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packrat.plan.profile import EAGER
from packrat.profiler.client import EngineTarget, _child_env, worker_source
from packrat.profiler.errors import ProfilerError

if TYPE_CHECKING:  # profiler imports this module lazily: only the types here
    from packrat.profiler.profiler import ProfileJob, ProfileRun

PREPARE_TIMEOUT_S = 1800.0  # AOTInductor compiles ResNet-50 in ~77 s on 2 quiet cores


def default_artefacts(output: str | Path | None) -> Path:
    """Where converted artefacts go unless told: ``artefacts/`` beside the profile file."""
    if output is None:
        raise ProfilerError("profiling engines other than eager needs --artefacts or -o")
    return Path(output).parent / "artefacts"


def prepare_engine(
    spec: str, engine: str, root: Path, *, threads: int, timeout_s: float = PREPARE_TIMEOUT_S
) -> dict[str, Any]:
    """Convert (or find) and check one engine in a child process: its verdict, always."""
    cmd = [
        sys.executable,
        "-m",
        "packrat.runtime.engines.prepare",
        "--model",
        spec,
        "--engine",
        engine,
        "--root",
        str(root),
        "--threads",
        str(threads),
    ]
    began = time.monotonic()
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_child_env(threads),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "engine": engine,
            "status": "excluded",
            "reason": f"no verdict in {timeout_s:.0f} s",
        }
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {
            "engine": engine,
            "status": "excluded",
            "reason": f"crashed while converting or checking (exit {done.returncode}): {tail}",
        }
    record: dict[str, Any] = json.loads(lines[-1])
    record["prepare_s"] = round(time.monotonic() - began, 3)
    return record


def run_engines(
    job: ProfileJob,
    *,
    engines: Sequence[str],
    artefacts: str | Path | None,
    eager_source: Any = None,
) -> ProfileRun:
    """Prepare every engine, then profile those that passed into one file."""
    from packrat.profiler.profiler import _run_profile

    began = time.monotonic()
    root = Path(artefacts) if artefacts is not None else default_artefacts(job.output)
    root.mkdir(parents=True, exist_ok=True)
    out = job.stream if job.stream is not None else sys.stderr
    records: dict[str, Any] = {}
    for name in dict.fromkeys([EAGER, *engines]):
        if name == EAGER:
            records[name] = {"engine": EAGER, "status": "ok"}
            continue
        record = prepare_engine(job.spec, name, root, threads=job.cpus)
        records[name] = record
        if record["status"] == "ok":
            how = "converted" if record.get("converted_now") else "found converted"
            seconds = record.get("artefact", {}).get("conversion_s", 0.0)
            print(f"engine {name}: {how} ({seconds:.1f} s), matches eager", file=out, flush=True)
        else:
            print(f"engine {name} left out: {record['reason']}", file=out, flush=True)
    wanted = [e for e in dict.fromkeys([EAGER, *engines]) if e in engines or e == EAGER]
    run = None
    for name in wanted:
        if records[name]["status"] != "ok":
            continue
        path = records[name].get("artefact", {}).get("path")
        target = None if name == EAGER else EngineTarget(name, Path(path) if path else None)
        given = eager_source if name == EAGER else None
        source = given or worker_source(job.settings.process, job.spec, None, target)
        try:
            run = _run_profile(
                job,
                handler=None,
                source=source,
                engine=name,
                run=run,
                began=began,
                engine_records=records,
            )
        finally:
            if given is None:
                source.close()
    assert run is not None
    return run
