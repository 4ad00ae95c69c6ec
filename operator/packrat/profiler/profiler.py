"""Measure a model's profile L(t, b) on this process's own cores, point by point.

Each grid point (t threads, batch b) is measured on its layout (:mod:`.layout`): by default
floor(T/t) identical instances co-located on disjoint cores of the profiled cpuset, all
timed, the remainder cores kept busy by an untimed filler (``mode="alone"``: one instance,
the other cores idle). The instances are worker processes forked from one process that
imported torch and built the model once (:mod:`.forked`; ``process="fresh"``: a fresh
process per instance, each with its own torch import and build), each pinned to its cores
with its thread counts before its first batch, and checked. They run lockstep rounds until
the 95% confidence interval of the mean is within the target precision or the point's time
budget ends (:mod:`.measure`). After every point the
profile file is rewritten atomically, so a killed run (a preempted Job, Ctrl-C) resumes
where it stopped: points already in the file are kept when the file is for the same model
digest, T and CPU model, and a file for anything else is refused rather than mixed.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from packrat.plan.profile import (
    COLOCATED,
    EAGER,
    ENGINES_KEY,
    MODES,
    Profile,
    ProfileMeta,
    ProfilePoint,
)
from packrat.profiler.checkpoint import existing_profile as _existing
from packrat.profiler.client import (
    PROCESS_KINDS,
    HandlerTarget,
    WorkerError,
    WorkerSource,
    worker_source,
)
from packrat.profiler.errors import ProfilerError
from packrat.profiler.layout import point_layout
from packrat.profiler.measure import measure_layout
from packrat.profiler.progress import Progress, estimate_seconds, format_duration
from packrat.profiler.verify import Verifier, allow_contended_default, set_aside
from packrat.runtime.cpus import (
    CoreAssignmentError,
    allowed_cpus,
    assign_cores,
    cpu_model,
    format_cpu_list,
)
from packrat.runtime.mar import is_archive, sha256_bytes
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


WEEK_S = 7 * 86400  # the longest budget a profile run (or one point) may be given


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
    # verified isolation (see .verify): calibrate cores, re-measure suspects, refuse or allow
    allow_contended: bool = field(default_factory=allow_contended_default)
    verify: bool = True
    remeasure_rounds: int = 2
    check_every: int = 8  # points between core calibrations
    calibration_s: float = 0.2
    # how each point is laid out (co-located | alone) and where its workers come from
    mode: str = COLOCATED
    process: str = "forked"  # forked from one process with the model built | fresh
    fill_remainder: bool = True  # co-located: an untimed filler on the T mod t cores
    # the progress JSON records (for the operator's log reader): None = when not a terminal
    progress_records: bool | None = None

    def check(self) -> None:
        if self.mode not in MODES:
            raise ProfilerError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.process not in PROCESS_KINDS:
            raise ProfilerError(
                f"--process must be one of {', '.join(PROCESS_KINDS)}, got {self.process!r}"
            )
        if not 0 < self.precision < 1:
            raise ProfilerError(f"--precision must be in (0, 1), got {self.precision}")
        # finite and at most a week: nan and inf were taken (issue 38's siblings)
        if not (math.isfinite(self.point_budget_s) and 0 < self.point_budget_s <= WEEK_S):
            raise ProfilerError(
                f"--point-budget must be in (0, {WEEK_S}], got {self.point_budget_s}"
            )
        if self.time_budget_s is not None and not (
            math.isfinite(self.time_budget_s) and 0 < self.time_budget_s <= WEEK_S
        ):
            raise ProfilerError(f"--time-budget must be in (0, {WEEK_S}], got {self.time_budget_s}")
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
    isolation: dict[str, Any] = field(default_factory=dict)  # the verdict, as recorded
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


@dataclass(frozen=True, slots=True)
class ProfileJob:
    """What one :func:`run_profile` call asked for, shared by every engine it profiles."""

    spec: str
    cpus: int
    max_batch: int
    output: str | Path | None
    threads: Sequence[int] | None
    extra_batches: Sequence[int]
    settings: ProfileSettings
    allowed: Sequence[int] | None
    stream: TextIO | None
    on_point: Callable[[ProfilePoint, dict[str, Any]], None] | None


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
    source: WorkerSource | None = None,
    engines: Sequence[str] = (EAGER,),
    artefacts: str | Path | None = None,
) -> ProfileRun:
    """Profile ``spec`` on a T-cpu grid; checkpoint to ``output`` after every point.

    With ``handler`` every point runs b copies of its sample request through the archive's
    handler (what a serving worker runs); ``spec`` still names the model and its digest.
    ``source``: where workers come from (default: per ``settings.process``, closed at the
    end; a given one is left open for the caller, e.g. to verify plans with it).
    ``engines``: profile L(engine, t, b) for each (:mod:`.engines`: converted once into the
    ``artefacts`` folder, checked against eager, left out with the reason when wrong); for a
    ``.mar`` its handler's module is converted and every point runs through the handler
    (:mod:`packrat.runtime.engines.handler`).
    """
    settings = settings or ProfileSettings()
    settings.check()
    if list(engines) != [EAGER] and handler is not None and not is_archive(spec):
        print(  # Packrat's own handler around a zoo model or file: said once, then eager
            f"engines {', '.join(e for e in engines if e != EAGER)} left out: a model profiled "
            "through Packrat's handler (--sample-request) runs eager; profile it without one",
            file=stream if stream is not None else sys.stderr,
            flush=True,
        )
        engines = (EAGER,)
    job = ProfileJob(
        spec=spec,
        cpus=cpus,
        max_batch=max_batch,
        output=output,
        threads=threads,
        extra_batches=extra_batches,
        settings=settings,
        allowed=allowed,
        stream=stream,
        on_point=on_point,
    )
    if list(engines) != [EAGER]:
        from packrat.profiler.engines import run_engines

        return run_engines(
            job, engines=engines, artefacts=artefacts, eager_source=source, handler=handler
        )
    own = source is None
    workers = source or worker_source(settings.process, spec, handler)
    try:
        return _run_profile(job, handler=handler, source=workers)
    finally:
        if own:
            workers.close()


def _run_profile(
    job: ProfileJob,
    *,
    handler: HandlerTarget | None,
    source: WorkerSource,
    engine: str = EAGER,
    run: ProfileRun | None = None,
    began: float | None = None,
    engine_records: dict[str, Any] | None = None,
) -> ProfileRun:
    spec, cpus, settings = job.spec, job.cpus, job.settings
    began = time.monotonic() if began is None else began
    try:
        digest = model_digest(spec)
    except ZooError as exc:
        raise ProfilerError(str(exc)) from None
    ts = thread_grid(cpus, job.threads)
    bs = batch_grid(job.max_batch, extra=job.extra_batches)
    pool = sorted(job.allowed) if job.allowed is not None else allowed_cpus()
    base = profile_cpus(cpus, allowed=pool)
    verifier = Verifier(
        requested=cpus,
        pool=pool,
        cores=base,
        calibration_s=settings.calibration_s,
        enabled=settings.verify,
    )
    meta = ProfileMeta(
        model=model_name(spec),
        model_digest=digest,
        cpu_model=cpu_model(),
        cpus=cpus,
        torch_version=_torch_version(),
        created=_now(),
        source="packrat profile",
        mode=settings.mode,
    )
    session = _Session(
        settings=settings,
        source=source,
        began=began,
        ts=ts,
        bs=bs,
        grid=[(t, b) for b in bs for t in ts],  # small batches first: cheapest, most used
        base=base,
        verifier=verifier,
        meta=meta,
        through=_through(handler),
        path=Path(job.output) if job.output is not None else None,
        run=run if run is not None else ProfileRun(profile=None, cpus=base),
        engine=engine,
    )
    session.resume(job.stream)
    if engine_records is not None:  # this run's verdicts; a left-out engine keeps no points
        session.extra[ENGINES_KEY] = {**session.extra.get(ENGINES_KEY, {}), **engine_records}
        passed = {e for e, r in engine_records.items() if r.get("status") == "ok"}
        session.others = [p for p in session.others if p.engine in passed]
    session.start_workers()
    session.measure_todo(job.on_point)
    session.verify()
    return session.finish()


def _through(handler: HandlerTarget | None) -> dict[str, Any]:
    """How the batches reach the model (recorded in the profile: a resumed run must match)."""
    if handler is None:
        return {"through": "model"}
    return {
        "through": "handler",
        "sample_request_sha256": sha256_bytes(handler.sample_request.read_bytes()),
        "sample_content_type": handler.content_type,
    }


@dataclass(slots=True)
class _Session:
    """One profiling run: its grid, the points measured or kept, the file it checkpoints to."""

    settings: ProfileSettings
    source: WorkerSource
    began: float
    ts: list[int]
    bs: list[int]
    grid: list[tuple[int, int]]
    base: list[int]
    verifier: Verifier
    meta: ProfileMeta
    through: dict[str, Any]
    path: Path | None
    run: ProfileRun
    points: dict[tuple[int, int], ProfilePoint] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    load_start: float = 0.0
    todo: list[tuple[int, int]] = field(default_factory=list)
    progress: Progress | None = None
    engine: str = EAGER  # the engine this session measures
    others: list[ProfilePoint] = field(default_factory=list)  # other engines' points, kept

    def tag(self, key: tuple[int, int]) -> str:
        return (
            f"t{key[0]}b{key[1]}" if self.engine == EAGER else f"{self.engine}/t{key[0]}b{key[1]}"
        )

    def resume(self, stream: TextIO | None) -> None:
        """Keep the points an earlier run of the same profile left in the file."""
        path = self.path
        old = _existing(path, self.meta, self.through) if path is not None else None
        if old is not None:
            self.others = [p for p in old.points if p.engine != self.engine]
            mine = old.for_engine(self.engine) if self.engine in old.engines else None
            self.points = dict(mine.index) if mine is not None else {}
            self.extra = dict(old.meta.extra)
            self.meta = replace(self.meta, created=old.meta.created or self.meta.created)
        run = self.run
        self.load_start = round(os.getloadavg()[0], 2)
        run.kept = [k for k in self.grid if k in self.points]
        self.todo = [k for k in self.grid if k not in self.points]
        label = f"profile {self.meta.model}" + (
            f" on {self.engine}" if self.engine != EAGER else ""
        )
        progress = Progress(
            len(self.grid), stream=stream, label=label, records=self.settings.progress_records
        )
        progress.done = len(run.kept)
        if run.kept:
            progress.show(f"resuming: {len(run.kept)} point(s) already in {path}")
        self.progress = progress

    def _progress(self) -> Progress:
        assert self.progress is not None, "resume() first"
        return self.progress

    def info(self) -> dict[str, Any]:
        """The profile's meta.extra: the grid, the settings and how the run went."""
        settings, run = self.settings, self.run
        grid_info = {"threads": self.ts, "batches": self.bs}
        info = {
            **self.extra,
            **self.through,
            "grid": grid_info,
            "cpuset": format_cpu_list(self.base),
            "precision": settings.precision,
            "point_budget_s": settings.point_budget_s,
            "warmup": settings.warmup,
            "min_samples": settings.min_samples,
            "process": (
                "workers forked from one process with the model built"
                if self.source.kind == "forked"
                else "fresh worker process per instance"
            ),
            "fill_remainder": settings.fill_remainder,
            # seconds spent starting workers (and the fork server), of the run's seconds
            "startup_s": {
                "workers": round(run.startup_s, 3),
                "elapsed": round(time.monotonic() - self.began, 3),
            },
            # the machine's load while measuring: a busy machine inflates wide instances most
            "loadavg_1m": {"start": self.load_start, "end": round(os.getloadavg()[0], 2)},
            "complete": all(k in self.points for k in self.grid),
            "updated": _now(),
        }
        if run.isolation:
            info["isolation"] = run.isolation
            if run.isolation.get("contaminated"):  # stored only when allowed: say so plainly
                info["contended"] = True
        return info

    def save(self) -> Profile | None:
        """The profile so far, written to the file (atomically) when there is one."""
        if not self.points:
            return None
        info = self.info()
        points = tuple(replace(p, engine=self.engine) for p in self.points.values())
        profile = Profile(meta=replace(self.meta, extra=info), points=points + tuple(self.others))
        profile = profile.with_points(profile.points)
        if self.path is not None:
            profile.save(self.path)
        return profile

    def measure(
        self, threads_: int, batch: int, budget: float
    ) -> tuple[ProfilePoint, dict[str, Any]]:
        settings = self.settings
        layout = point_layout(
            threads_, self.base, mode=settings.mode, fill_remainder=settings.fill_remainder
        )
        try:
            return measure_layout(
                self.source, layout, batch=batch, settings=settings, budget_s=budget
            )
        except WorkerError as exc:
            raise ProfilerError(
                f"measuring threads={threads_} batch={batch} failed: {exc}"
            ) from None

    def start_workers(self) -> None:
        source = self.source
        before = source.startup_s
        try:
            source.start()  # once per source: a source shared by several runs is counted once
        except WorkerError as exc:
            raise ProfilerError(f"cannot start the profiling workers: {exc}") from None
        self.run.startup_s += source.startup_s - before

    def measure_todo(self, on_point: Callable[[ProfilePoint, dict[str, Any]], None] | None) -> None:
        """Measure the points not kept, in grid order, checkpointing after each, until the
        run's time budget ends."""
        settings, run = self.settings, self.run
        first = self.verifier.check()
        if first is not None and not first.quiet:
            self._progress().show("warning: " + "; ".join(first.reasons()))
        for index, (threads_, batch) in enumerate(self.todo):
            if index and settings.check_every and index % settings.check_every == 0:
                self.verifier.check()
            left = None
            if settings.time_budget_s is not None:
                left = settings.time_budget_s - (time.monotonic() - self.began)
                if left < 1.0:
                    run.stopped = "time_budget"
                    break
            budget = settings.point_budget_s if left is None else min(settings.point_budget_s, left)
            point_began = time.monotonic()
            point, report = self.measure(threads_, batch, budget)
            seconds = time.monotonic() - point_began
            self.record(point, report, label=f"t{threads_}b{batch}")
            if on_point is not None:
                on_point(point, report)
            self.show_step(threads_, batch, point, report, seconds=seconds, left=left)

    def record(self, point: ProfilePoint, report: dict[str, Any], *, label: str) -> None:
        """Keep a measured point and its report, and checkpoint the profile."""
        run, extra = self.run, self.extra
        run.startup_s += report["startup_s"]
        label = self.tag(point.key)
        point = replace(point, engine=self.engine)
        self.points[point.key] = point
        run.measured.append(point.key)
        if report["cpu_share"] is not None:
            shares = dict(extra.get("cpu_share", {}))
            shares[label] = round(report["cpu_share"], 3)
            extra["cpu_share"] = shares
        colocated = dict(extra.get("colocated", {}))
        colocated[label] = {
            "instances": report["instances"],
            "filler_threads": report["filler"],
            "slowest_ms": round(report["slowest_ms"], 4),
        }
        extra["colocated"] = colocated
        run.profile = self.save()

    def show_step(
        self,
        threads_: int,
        batch: int,
        point: ProfilePoint,
        report: dict[str, Any],
        *,
        seconds: float,
        left: float | None,
    ) -> None:
        """The progress line of one point, with the run's estimated time left."""
        cap = None if left is None else left - seconds
        remaining = [k for k in self.todo if k not in self.points]
        estimate = estimate_seconds(
            remaining,
            self.points,
            settings=self.settings,
            startup_s=self.run.startup_s / len(self.run.measured),
        )
        self._progress().step(
            f"t={threads_} b={batch} x{report['instances']}: {point.latency_ms:.2f} ms "
            f"±{report['rel_ci'] * 100:.1f}% n={point.samples} ({report['stopped']}) "
            f"cpu share {report['cpu_share'] or 0:.2f}",
            seconds=seconds,
            cap=cap,
            estimate=estimate,
        )

    def verify(self) -> None:
        """Whether the cores stayed quiet; suspect points are re-measured (--verify)."""
        settings, run, progress = self.settings, self.run, self._progress()
        run.missing = [k for k in self.grid if k not in self.points]
        if settings.verify and self.points:

            def again(key: tuple[int, int]) -> ProfilePoint:
                point, _ = self.measure(key[0], key[1], settings.point_budget_s)
                progress.show(f"re-measured t={key[0]} b={key[1]}: {point.latency_ms:.2f} ms")
                return point

            run.isolation = self.verifier.finish(
                self.points,
                again,
                rounds=settings.remeasure_rounds,
                allowed=settings.allow_contended,
                show=progress.show,
            )

    def finish(self) -> ProfileRun:
        """The last checkpoint; a contaminated profile is set aside and refused."""
        run = self.run
        run.profile = self.save()
        run.elapsed_s = time.monotonic() - self.began
        if run.isolation.get("contaminated") and not self.settings.allow_contended:
            kept = set_aside(self.path)
            raise ProfilerError(
                "refusing to store a contaminated profile: "
                + "; ".join(run.isolation["reasons"])
                + (f" (measurements kept in {kept})" if kept else "")
                + "; profile on exclusive, quiet cores, or allow it with --allow-contended"
            )
        verdict = "complete" if not run.missing else f"stopped by {run.stopped.replace('_', ' ')}"
        self._progress().finish(
            f"{verdict}: {len(run.measured)} measured, {len(run.kept)} kept, "
            f"{len(run.missing)} missing, in {format_duration(run.elapsed_s)} "
            f"(worker start-up {run.startup_s:.1f} s, "
            f"{100 * run.startup_s / max(run.elapsed_s, 1e-9):.0f}%)"
        )
        return run
