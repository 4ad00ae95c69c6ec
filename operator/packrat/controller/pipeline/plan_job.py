"""The pipeline planner in a child process with a time and a memory limit.

The planner (:func:`packrat.plan.pipeline.provision.provision_pipeline`) simulates dozens of
configurations over the sample trace; its cost grows with the stages and the arrivals a
pipeline author chooses. Run inside the operator, a 16-stage chain at the 200,000 arrivals the
CRD admits was still planning after 300 s at 1.43 GB, three times the operator's memory limit:
one author could take the operator down for every namespace, and, the plan being cached in
memory only, again after every restart.

So the operator never plans in its own process. :func:`run_bounded` forks a child (from a
fork server holding the planner's modules) that sets ``RLIMIT_AS`` (its address space:
``memory_mib``) and ``RLIMIT_CPU`` before it plans, and kills it when ``seconds`` of wall
time have passed. Children are bounded in number too (issue 38: three at once took 632 MB
beside a 114 MB operator under a 512 MiB limit): at most :data:`MAX_CHILDREN` run at once, for
the whole operator; a pipeline that finds none free within :data:`SLOT_WAIT_SECONDS` is not
planned in that pass (``PlanningQueued``, tried again at the next), so a burst of pipelines
costs one child's memory and holds one reconcile thread, not one each.

What it answers, the stages' configurations and the summary the status shows
(:class:`PlannedPipeline`), is small and JSON; the caller persists it (a ConfigMap the pipeline
owns) and persists a failure in the status, so a restarted operator neither plans the same
inputs again nor retries what was too expensive.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class PlanJobError(Exception):
    """The child did not plan: ``reason`` (``PlanningBudgetExceeded``, ``ProvisionFailed``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """What one planning run may take: wall seconds and MiB of address space."""

    seconds: float = 60.0
    memory_mib: int = 320

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.memory_mib < 128:
            raise ValueError("a planning budget needs seconds > 0 and at least 128 MiB")


@dataclass(frozen=True, slots=True)
class PlannedPipeline:
    """The planner's answer as the controller uses it (JSON both ways)."""

    configs: dict[str, dict[str, Any]]
    baselines: dict[str, dict[str, Any]]
    cores: int
    p99_ms: float | None
    feasible: bool

    def to_json(self) -> str:
        return json.dumps(
            {
                "configs": self.configs,
                "baselines": self.baselines,
                "cores": self.cores,
                "p99Ms": self.p99_ms,
                "feasible": self.feasible,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> PlannedPipeline:
        """ValueError when ``text`` is not one (a ConfigMap edited by hand, a broken child)."""
        try:
            doc = json.loads(text)
            p99 = doc["p99Ms"]
            planned = cls(
                configs={str(k): dict(v) for k, v in dict(doc["configs"]).items()},
                baselines={str(k): dict(v) for k, v in dict(doc["baselines"]).items()},
                cores=int(doc["cores"]),
                p99_ms=None if p99 is None else float(p99),
                feasible=bool(doc["feasible"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise ValueError(f"not a planned pipeline: {exc}") from None
        return planned


# One fork server per process, with the planner's modules imported once: a planning run is
# a fork of it (milliseconds), not a new interpreter (a second of imports). The server is a
# fresh single-threaded process, so forking it is safe in the operator, which has threads.
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(
    ["numpy", "packrat.plan.pipeline.provision", "packrat.controller.pipeline.planning"]
)


# One child at a time: the default budget (320 MiB) beside the operator fits the chart's memory
# limit once, not twice.
MAX_CHILDREN = 1
CHILDREN = threading.BoundedSemaphore(MAX_CHILDREN)
SLOT_WAIT_SECONDS = 1.0
QUEUED = "PlanningQueued"


def run_bounded(job: Mapping[str, Any], budget: PlanBudget) -> PlannedPipeline:
    """Plan ``job`` (see :func:`_plan`) in a child within ``budget``; :class:`PlanJobError`
    (reason :data:`QUEUED` when every child slot stayed taken: not a failure, try again)."""
    if not CHILDREN.acquire(timeout=SLOT_WAIT_SECONDS):
        raise PlanJobError(
            QUEUED, "another pipeline is being planned: this one is planned after it"
        )
    try:
        return _run_child(job, budget)
    finally:
        CHILDREN.release()


def _run_child(job: Mapping[str, Any], budget: PlanBudget) -> PlannedPipeline:
    receive, send = _CONTEXT.Pipe(duplex=False)
    proc = _CONTEXT.Process(target=_child, args=(dict(job), budget, send), daemon=True)
    proc.start()
    send.close()
    try:
        answered = receive.poll(budget.seconds)
        kind, text = receive.recv() if answered else ("timeout", "")
    except (EOFError, OSError):  # the child died without a word: killed by a limit
        kind, text = "memory", ""
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join(10)
    if kind == "ok":
        try:
            return PlannedPipeline.from_json(text)
        except ValueError as exc:
            raise PlanJobError("ProvisionFailed", str(exc)) from None
    if kind == "infeasible":
        raise PlanJobError("ProvisionFailed", text[-500:])
    if kind == "timeout":
        raise PlanJobError(
            "PlanningBudgetExceeded",
            f"planning took longer than {budget.seconds:g} s (fewer stages, a shorter "
            "trace, or a larger --pipeline-plan-seconds)",
        )
    raise PlanJobError(
        "PlanningBudgetExceeded",
        f"planning needed more than {budget.memory_mib} MiB (fewer stages, a shorter trace, "
        "or a larger --pipeline-plan-memory-mib)",
    )


def _child(job: dict[str, Any], budget: PlanBudget, send: Any) -> None:  # pragma: no cover
    """The child: limits first, then the plan; one message back ("ok", "infeasible",
    "memory"), or none when a limit killed it."""
    memory = budget.memory_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(budget.seconds) + 2  # a backstop: the parent kills at the wall deadline
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    try:
        send.send(("ok", _plan(job).to_json()))
    except MemoryError:
        send.send(("memory", ""))
    except ValueError as exc:  # PipelineError, ProvisionError, PlanError, SimulationError
        send.send(("infeasible", str(exc)))
    finally:
        send.close()
        # no interpreter shutdown: at its memory limit it would fail again, noisily
        os._exit(0)


def _plan(job: Mapping[str, Any]) -> PlannedPipeline:  # pragma: no cover - in the child
    """The job: ``stages`` ([{name, profile (the profile JSON text), cpus}]), ``edges``
    ([[src, dst, fraction]]), ``trace`` (arrival seconds), ``sloMs``, ``maxCores``,
    ``delayMs``, ``hopMs``."""
    import numpy as np

    from packrat.controller.pipeline.planning import baselines, stage_configs
    from packrat.plan.pipeline.provision import provision_pipeline
    from packrat.plan.pipeline.search import PipelinePlanner
    from packrat.plan.pipeline.simulate import Edge, Pipeline, Stage
    from packrat.plan.profile import parse_profile
    from packrat.plan.provision import SimSettings

    pipeline = Pipeline(
        [
            Stage(s["name"], parse_profile(s["profile"], origin=s["name"]).table(), s["cpus"])
            for s in job["stages"]
        ],
        [Edge(str(a), str(b), float(f)) for a, b, f in job["edges"]],
    )
    prov = provision_pipeline(
        PipelinePlanner(
            pipeline,
            np.asarray(job["trace"], dtype=float),
            slo_ms=float(job["sloMs"]),
            max_cores=job["maxCores"],
            sim=SimSettings(
                max_batch_delay_ms=float(job["delayMs"]), overhead_ms=float(job["hopMs"])
            ),
        )
    )
    p99 = float(prov.best.p99_ms)
    return PlannedPipeline(
        configs=stage_configs(prov),
        baselines=baselines(prov),
        cores=int(prov.best.cores),
        p99_ms=p99 if np.isfinite(p99) else None,
        feasible=bool(prov.feasible),
    )
