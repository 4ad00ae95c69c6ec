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

A ``.mar`` (profiled through its handler) has its handler's ``model`` converted, its inputs
captured from the sample request (:mod:`packrat.runtime.engines.handler`), and each engine's
points measured through the handler with that module swapped for the artefact's runner. A
handler with no module an engine can take leaves every engine out in one line.
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
from packrat.profiler.client import EngineTarget, HandlerTarget, _child_env, worker_source
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
    spec: str,
    engine: str,
    root: Path,
    *,
    threads: int,
    timeout_s: float = PREPARE_TIMEOUT_S,
    handler: HandlerTarget | None = None,
) -> dict[str, Any]:
    """Convert (or find) and check one engine in a child process: its verdict, always.
    A ``.mar`` (``handler``) has its handler's module converted, captured from the sample
    request."""
    sample = [] if handler is None else [
        "--sample-request", str(handler.sample_request), "--content-type", handler.content_type
    ]  # fmt: skip
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
        *sample,
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
    handler: HandlerTarget | None = None,
) -> ProfileRun:
    """Prepare every engine, then profile those that passed into one file (through the
    archive's ``handler``, its module swapped for each engine's artefact, for a ``.mar``)."""
    from packrat.profiler.profiler import _run_profile

    began = time.monotonic()
    root = Path(artefacts) if artefacts is not None else default_artefacts(job.output)
    root.mkdir(parents=True, exist_ok=True)
    records = _prepare_all(job, engines, root, handler)
    run = None
    for name in dict.fromkeys([EAGER, *engines]):
        if records[name]["status"] != "ok":
            continue
        path = records[name].get("artefact", {}).get("path")
        target = None if name == EAGER else EngineTarget(name, Path(path) if path else None)
        given = eager_source if name == EAGER else None
        source = given or worker_source(job.settings.process, job.spec, handler, target)
        try:
            run = _run_profile(
                job,
                handler=handler,
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


def _prepare_all(
    job: ProfileJob, engines: Sequence[str], root: Path, handler: HandlerTarget | None
) -> dict[str, Any]:
    """Every engine's verdict, each said in one line. A ``.mar`` whose handler has no module
    an engine can take leaves every engine out at once, said once."""
    out = job.stream if job.stream is not None else sys.stderr
    records: dict[str, Any] = {EAGER: {"engine": EAGER, "status": "ok"}}
    others = [e for e in dict.fromkeys(engines) if e != EAGER]
    for i, name in enumerate(others):
        record = prepare_engine(job.spec, name, root, threads=job.cpus, handler=handler)
        records[name] = record
        if record.get("handler") == "eager":  # the same for every engine: not tried again
            rest = others[i:]
            records.update({e: {**record, "engine": e} for e in rest})
            print(f"engines {', '.join(rest)} left out: {record['reason']}", file=out, flush=True)
            break
        if record["status"] == "ok":
            how = "converted" if record.get("converted_now") else "found converted"
            seconds = record.get("artefact", {}).get("conversion_s", 0.0)
            print(f"engine {name}: {how} ({seconds:.1f} s), matches eager", file=out, flush=True)
        else:
            print(f"engine {name} left out: {record['reason']}", file=out, flush=True)
    return records
