"""Measure a model's profile L(t, b) on this process's own cores, point by point.

Each grid point (t threads, batch b) is measured by one instance alone, in a fresh worker
process pinned to ``t`` cores taken from the allowed cpuset (see :mod:`.worker` for why a
fresh process). The worker warms up and samples until the 95% confidence interval of the
mean is within the target precision or the point's time budget ends. After every point the
profile file is rewritten atomically, so a killed run (a preempted Job, Ctrl-C) resumes
where it stopped: points already in the file are kept when the file is for the same model
digest, T and CPU model, and a file for anything else is refused rather than mixed.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from packrat.plan.profile import Profile, ProfileError, ProfileMeta, ProfilePoint, load_profile
from packrat.profiler.client import HandlerTarget, WorkerError, WorkerProcess
from packrat.profiler.progress import Progress, format_duration
from packrat.profiler.stats import summarize
from packrat.runtime.cpus import (
    CoreAssignmentError,
    allowed_cpus,
    assign_cores,
    cpu_model,
    format_cpu_list,
)
from packrat.runtime.mar import sha256_bytes
from packrat.runtime.zoo import ZooError, model_digest, model_name

log = logging.getLogger(__name__)

__all__ = [
    "ProfileRun",
    "ProfileSettings",
    "ProfilerError",
    "batch_grid",
    "profile_cpus",
    "run_profile",
    "thread_grid",
]


class ProfilerError(RuntimeError):
    """The profile cannot be (or could not be) measured as asked; the message says why."""


def batch_grid(max_batch: int, *, extra: Sequence[int] = ()) -> list[int]:
    """Powers of two up to ``max_batch``, plus any ``extra`` batch sizes (<= max_batch)."""
    if max_batch < 1:
        raise ProfilerError(f"--max-batch must be >= 1, got {max_batch}")
    out = set()
    b = 1
    while b <= max_batch:
        out.add(b)
        b *= 2
    out.update(x for x in extra if 1 <= x <= max_batch)
    return sorted(out)


def thread_grid(cpus: int, threads: Sequence[int] | None = None) -> list[int]:
    """1..T, or the given thread counts (each within 1..T)."""
    if cpus < 1:
        raise ProfilerError(f"--cpus must be >= 1, got {cpus}")
    if not threads:
        return list(range(1, cpus + 1))
    bad = [t for t in threads if t < 1 or t > cpus]
    if bad:
        raise ProfilerError(f"thread counts {bad} are outside 1..{cpus} (--cpus {cpus})")
    return sorted(set(threads))


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """How to measure each point."""

    precision: float = 0.02  # target: 95% CI half-width of the mean / mean
    point_budget_s: float = 20.0  # per point, warm-up included
    time_budget_s: float | None = None  # whole run
    warmup: int = 2
    min_samples: int = 5
    max_samples: int = 100_000  # the budget or the precision stops first in practice
    startup_timeout_s: float = 300.0

    def check(self) -> None:
        if not 0 < self.precision < 1:
            raise ProfilerError(f"--precision must be in (0, 1), got {self.precision}")
        if self.point_budget_s <= 0:
            raise ProfilerError(f"--point-budget must be > 0, got {self.point_budget_s}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ProfilerError(f"--time-budget must be > 0, got {self.time_budget_s}")
        if self.warmup < 0 or self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ProfilerError(
                "need --warmup >= 0, --min-samples >= 1 and max samples >= min samples"
            )


@dataclass(slots=True)
class ProfileRun:
    """What one invocation did."""

    profile: Profile | None
    measured: list[tuple[int, int]] = field(default_factory=list)
    kept: list[tuple[int, int]] = field(default_factory=list)
    missing: list[tuple[int, int]] = field(default_factory=list)
    stopped: str = "complete"  # complete | time_budget
    elapsed_s: float = 0.0
    startup_s: float = 0.0  # total time spent starting workers (process + torch + model)
    cpus: list[int] = field(default_factory=list)


def profile_cpus(cpus: int, *, allowed: Sequence[int] | None = None) -> list[int]:
    """The T cpus to profile on: a socket-local subset of this process's allowed cpus."""
    pool = sorted(allowed) if allowed is not None else allowed_cpus()
    if cpus > len(pool):
        raise ProfilerError(
            f"--cpus {cpus} but this process may only use {len(pool)} cpu(s) "
            f"({format_cpu_list(pool)}); the profile must be measured on as many cores as it "
            f"will serve on"
        )
    if cpus == len(pool):
        return pool
    try:
        return assign_cores([cpus], cpus=pool, span_sockets=True)[0]
    except CoreAssignmentError as exc:
        raise ProfilerError(str(exc)) from None


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _existing(path: Path, meta: ProfileMeta, through: dict[str, Any]) -> Profile | None:
    """The profile already at ``path`` if it is for the same model, T and CPU; else refuse."""
    if not path.exists():
        return None
    try:
        old = load_profile(path)
    except ProfileError as exc:
        raise ProfilerError(
            f"{path} exists but is not a readable profile ({exc}); move it away or choose "
            f"another -o"
        ) from None
    mismatches = [
        f"{name} {got!r} (this run: {want!r})"
        for name, got, want in (
            ("model digest", old.meta.model_digest, meta.model_digest),
            ("cpus", old.meta.cpus, meta.cpus),
            ("cpu model", old.meta.cpu_model, meta.cpu_model),
            *(
                (key, old.meta.extra.get(key, "model" if key == "through" else None), want)
                for key, want in through.items()
                if key != "sample_content_type"
            ),
        )
        if got != want
    ]
    if mismatches:
        raise ProfilerError(
            f"{path} holds a profile of {old.meta.model!r} with "
            + ", ".join(mismatches)
            + "; refusing to mix measurements: choose another -o or delete the file"
        )
    return old


def estimate_seconds(
    todo: Sequence[tuple[int, int]],
    points: dict[tuple[int, int], ProfilePoint],
    *,
    settings: ProfileSettings,
    startup_s: float,
) -> float | None:
    """Time the points in ``todo`` will take, extrapolated from the points measured so far.

    L(t, b) is taken as linear in b from the largest measured batch with the same t (or any
    t, scaled by threads); a point costs start-up + (warm-up + samples) x L, capped by the
    per-point budget. None until at least one point is known.
    """
    if not points:
        return None
    samples = [p.samples for p in points.values() if p.samples] or [settings.min_samples]
    typical_n = max(settings.min_samples, sum(samples) / len(samples))
    total = 0.0
    for t, b in todo:
        same = [p for p in points.values() if p.threads == t]
        ref = max(same or points.values(), key=lambda p: (p.batch, -abs(p.threads - t)))
        latency_s = ref.latency_ms / 1000.0 * b / ref.batch
        if not same:
            latency_s *= ref.threads / t
        work = (settings.warmup + typical_n) * latency_s
        total += startup_s + min(settings.point_budget_s + latency_s, work)
    return total


def measure_point(
    *,
    spec: str,
    threads: int,
    batch: int,
    cores: Sequence[int],
    settings: ProfileSettings,
    budget_s: float,
    handler: HandlerTarget | None = None,
) -> tuple[ProfilePoint, dict[str, Any]]:
    """Measure one point in a fresh worker; returns the point and the worker's reports."""
    worker = WorkerProcess(spec=spec, cpus=cores, threads=threads, handler=handler)
    try:
        ready = worker.wait_ready(timeout=settings.startup_timeout_s)
        if sorted(ready["affinity"]) != sorted(cores) or ready["threads"] != threads:
            raise ProfilerError(
                f"worker pinned to {ready['affinity']} with {ready['threads']} threads, "
                f"expected {sorted(cores)} with {threads}"
            )
        reply = worker.request(
            {
                "cmd": "measure",
                "batch": batch,
                "warmup": settings.warmup,
                "min_samples": settings.min_samples,
                "max_samples": settings.max_samples,
                "precision": settings.precision,
                "budget_s": budget_s,
            },
            # a batch may be slow, but never pathologically: budget plus generous slack
            timeout=budget_s * 3 + 600,
        )
        worker.close()
    except BaseException:
        worker.kill()
        raise
    summary = summarize(reply["samples_ms"])
    point = ProfilePoint(
        threads=threads,
        batch=batch,
        latency_ms=summary.mean,
        samples=summary.n,
        p50_ms=summary.p50,
        p99_ms=summary.p99,
        cv=summary.cv,
    )
    report = {
        "ready": ready,
        "startup_s": worker.startup_s,
        "stopped": reply["stopped"],
        "rel_ci": summary.rel_ci,
        "cpu_share": reply.get("cpu_share"),
        "elapsed_s": reply["elapsed_s"],
    }
    return point, report


def run_profile(
    *,
    spec: str,
    cpus: int,
    max_batch: int,
    output: str | Path | None,
    threads: Sequence[int] | None = None,
    extra_batches: Sequence[int] = (),
    settings: ProfileSettings | None = None,
    allowed: Sequence[int] | None = None,
    stream: TextIO | None = None,
    on_point: Callable[[ProfilePoint, dict[str, Any]], None] | None = None,
    handler: HandlerTarget | None = None,
) -> ProfileRun:
    """Profile ``spec`` on a T-cpu grid; checkpoint to ``output`` after every point.

    With ``handler`` every point runs b copies of its sample request through the archive's
    handler (what a serving worker runs); ``spec`` still names the model and its digest.
    """
    settings = settings or ProfileSettings()
    settings.check()
    began = time.monotonic()
    try:
        digest = model_digest(spec)
    except ZooError as exc:
        raise ProfilerError(str(exc)) from None
    ts = thread_grid(cpus, threads)
    bs = batch_grid(max_batch, extra=extra_batches)
    base = profile_cpus(cpus, allowed=allowed)
    grid = [(t, b) for b in bs for t in ts]  # small batches first: cheapest, most used
    meta = ProfileMeta(
        model=model_name(spec),
        model_digest=digest,
        cpu_model=cpu_model(),
        cpus=cpus,
        torch_version=_torch_version(),
        created=_now(),
        source="packrat profile",
    )
    through: dict[str, Any] = {"through": "model"}
    if handler is not None:
        through = {
            "through": "handler",
            "sample_request_sha256": sha256_bytes(handler.sample_request.read_bytes()),
            "sample_content_type": handler.content_type,
        }
    path = Path(output) if output is not None else None
    old = _existing(path, meta, through) if path is not None else None
    points: dict[tuple[int, int], ProfilePoint] = {}
    extra: dict[str, Any] = {}
    if old is not None:
        points = dict(old.index)
        extra = dict(old.meta.extra)
        meta = replace(meta, created=old.meta.created or meta.created)
    run = ProfileRun(profile=None, cpus=base)
    load_start = round(os.getloadavg()[0], 2)
    run.kept = [k for k in grid if k in points]
    todo = [k for k in grid if k not in points]
    progress = Progress(len(grid), stream=stream, label=f"profile {meta.model}")
    progress.done = len(run.kept)
    if run.kept:
        progress.show(f"resuming: {len(run.kept)} point(s) already in {path}")

    def save() -> Profile | None:
        if not points:
            return None
        grid_info = {"threads": ts, "batches": bs}
        info = {
            **extra,
            **through,
            "grid": grid_info,
            "cpuset": format_cpu_list(base),
            "precision": settings.precision,
            "point_budget_s": settings.point_budget_s,
            "warmup": settings.warmup,
            "min_samples": settings.min_samples,
            "process": "fresh worker process per point",
            # the machine's load while measuring: a busy machine inflates wide instances most
            "loadavg_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
            "complete": all(k in points for k in grid),
            "updated": _now(),
        }
        profile = Profile(meta=replace(meta, extra=info), points=tuple(points.values()))
        profile = profile.with_points(profile.points)
        if path is not None:
            profile.save(path)
        return profile

    for threads_, batch in todo:
        left = None
        if settings.time_budget_s is not None:
            left = settings.time_budget_s - (time.monotonic() - began)
            if left < 1.0:
                run.stopped = "time_budget"
                break
        budget = settings.point_budget_s if left is None else min(settings.point_budget_s, left)
        cores = assign_cores([threads_], cpus=base, span_sockets=True)[0]
        point_began = time.monotonic()
        try:
            point, report = measure_point(
                spec=spec,
                threads=threads_,
                batch=batch,
                cores=cores,
                settings=settings,
                budget_s=budget,
                handler=handler,
            )
        except WorkerError as exc:
            raise ProfilerError(
                f"measuring threads={threads_} batch={batch} failed: {exc}"
            ) from None
        seconds = time.monotonic() - point_began
        run.startup_s += report["startup_s"]
        points[point.key] = point
        run.measured.append(point.key)
        if report["cpu_share"] is not None:
            shares = dict(extra.get("cpu_share", {}))
            shares[f"t{threads_}b{batch}"] = round(report["cpu_share"], 3)
            extra["cpu_share"] = shares
        run.profile = save()
        if on_point is not None:
            on_point(point, report)
        cap = None if left is None else left - seconds
        remaining = [k for k in todo if k not in points]
        estimate = estimate_seconds(
            remaining,
            points,
            settings=settings,
            startup_s=run.startup_s / len(run.measured),
        )
        progress.step(
            f"t={threads_} b={batch}: {point.latency_ms:.2f} ms "
            f"±{report['rel_ci'] * 100:.1f}% n={point.samples} ({report['stopped']}) "
            f"cpu share {report['cpu_share'] or 0:.2f}",
            seconds=seconds,
            cap=cap,
            estimate=estimate,
        )
    run.missing = [k for k in grid if k not in points]
    run.profile = save()
    run.elapsed_s = time.monotonic() - began
    verdict = "complete" if not run.missing else f"stopped by {run.stopped.replace('_', ' ')}"
    progress.finish(
        f"{verdict}: {len(run.measured)} measured, {len(run.kept)} kept, "
        f"{len(run.missing)} missing, in {format_duration(run.elapsed_s)} "
        f"(worker start-up {run.startup_s:.1f} s)"
    )
    return run
