"""Verify a profile's plans for real: each plan against the fat instance, side by side.

The optimizer's speedup is an *expectation*: it adds up latencies measured one instance at a
time, and a plan's instances then run together, sharing caches, memory bandwidth and the
package's power budget. The profiling run is the one place that can measure the real thing
cheaply: it holds the same pinned cores, the same model and the same worker processes, and a
serving pod never runs the fat instance it is compared with. So right after the profile,
for each batch size the model may serve, Packrat's microbenchmark (:func:`run_bench`, plan
and fat interleaved, medians) runs the optimizer's plan and the fat instance, and the
results are kept in the profile's ``meta.extra["verified"]``. The operator shows one as
``status.measured`` while the served plan is the verified one.

A verification that fails (a worker dies, a batch times out) never costs the profile: the
error is recorded instead and the profile is kept.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any, TextIO

from packrat.bench.microbench import run_bench
from packrat.plan.profile import VERIFIED_KEY, Profile
from packrat.profiler.client import HandlerTarget, WorkerSource
from packrat.profiler.profiler import ProfilerError

CONFIGS = ("plan", "fat")


def verify_plans(
    profile: Profile,
    *,
    spec: str,
    cpus: int,
    batches: Sequence[int],
    repeats: int = 5,
    warmup: int = 1,
    handler: HandlerTarget | None = None,
    stream: TextIO | None = None,
    source: WorkerSource | None = None,
) -> dict[str, Any]:
    """Measure plan vs fat for ``batches``; the record kept under ``meta.extra["verified"]``:
    ``{"measuredAt", "repeats", "results": [{batch, plan, label, planMs, expectedMs, fatMs,
    speedup, expectedSpeedup, planSpread, fatSpread}]}`` or ``{"measuredAt", "error"}``."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    wanted = sorted({b for b in batches if 1 <= b <= max(profile.batches)})
    try:
        results = run_bench(
            spec=spec,
            cpus=cpus,
            batches=wanted,
            profile=profile,
            repeats=repeats,
            warmup=warmup,
            names=CONFIGS,
            handler=handler,
            stream=stream,
            source=source,
        )
    except (ProfilerError, OSError, TimeoutError, RuntimeError) as exc:
        return {"measuredAt": when, "error": f"{type(exc).__name__}: {exc}"[:500]}
    out = []
    for r in results:
        plan, fat = r.configs["plan"].summary, r.configs["fat"].summary
        out.append(
            {
                "batch": r.batch,
                "label": r.plan.label,
                "plan": r.plan.to_dict(),
                "planMs": plan.p50,
                # the optimizer's estimate for this very plan: a mixed plan's instances have
                # neighbours of other widths than any profiled point, so the measurement is
                # the corrected estimate (status.measured shows both)
                "expectedMs": r.plan.expected_latency_ms,
                "fatMs": fat.p50,
                "speedup": r.measured_speedup,
                "expectedSpeedup": r.expected_speedup,
                "planSpread": [plan.min, plan.max],
                "fatSpread": [fat.min, fat.max],
            }
        )
    return {"measuredAt": when, "repeats": repeats, "results": out}


def with_verification(profile: Profile, record: dict[str, Any]) -> Profile:
    """The profile with ``record`` under ``meta.extra["verified"]``."""
    extra = {**profile.meta.extra, VERIFIED_KEY: record}
    return dataclasses.replace(profile, meta=dataclasses.replace(profile.meta, extra=extra))


def format_verification(record: dict[str, Any]) -> str:
    """One line per batch size: the measured against the expected speedup."""
    if "error" in record:
        return f"plan verification failed: {record['error']}"
    lines = []
    for r in record.get("results", []):
        expected = r.get("expectedSpeedup")
        shown = "-" if expected is None else f"{expected:.2f}x"
        lines.append(
            f"verified B={r['batch']}: plan {r['label']} {r['planMs']:.2f} ms vs fat "
            f"{r['fatMs']:.2f} ms: {r['speedup']:.2f}x measured ({shown} expected)"
        )
    return "\n".join(lines)
