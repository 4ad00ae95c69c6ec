"""Provisioning a pipeline for one end-to-end P99 SLO at the fewest cores: the answer.

:func:`provision_pipeline` runs InferLine's search (:mod:`packrat.plan.pipeline.search`)
on a sample trace, computes each stage's Packrat plan for its chosen cores and batch, and
adds the coarse-grained baselines (:mod:`packrat.plan.pipeline.baselines`); what
``packrat provision --pipeline`` prints. For each stage's tuner it also keeps what the plan
was simulated on: the arrivals that stage saw on the sample trace (seconds, sorted) and the
queries per second one of its replicas sustains at best.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat.plan.optimizer import Optimizer
from packrat.plan.pipeline.baselines import coarse_baselines
from packrat.plan.pipeline.search import PipelineEvaluation, PipelinePlanner
from packrat.plan.pipeline.simulate import Pipeline
from packrat.plan.provision import trace_summary
from packrat.plan.search import finite


@dataclass(slots=True)
class PipelineProvision:
    """The planner's answer, with the coarse-grained baselines."""

    pipeline: Pipeline
    best: PipelineEvaluation
    plans: dict[str, dict[str, Any]]
    scale: dict[str, float]
    slo_ms: float
    baselines: dict[str, dict[str, Any]]
    evaluations: int
    wall_s: float
    trace: dict[str, float]
    steps: list[str] = field(default_factory=list)
    # per stage: the arrivals it saw in the best configuration's simulation (s, sorted) and
    # one replica's best throughput (queries/s): the reference its tuner scales from
    stage_arrivals: dict[str, np.ndarray] = field(default_factory=dict)
    capacity: dict[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.best.feasible

    def to_dict(self) -> dict[str, Any]:
        stages = []
        for i, name in enumerate(self.pipeline.order):
            c = self.best.configs[i]
            stages.append(
                {
                    "name": name,
                    "scale_factor": self.scale[name],
                    "replicas": c.replicas,
                    "cpus_per_replica": c.cpus,
                    "batch": c.batch,
                    "cores": c.cores,
                    "plan": self.plans[name],
                    "stage_p99_ms": finite(self.best.stage_p99_ms[i]),
                }
            )
        return {
            "stages": stages,
            "cores": self.best.cores,
            "simulated_p99_ms": finite(self.best.p99_ms),
            "slo_p99_ms": self.slo_ms,
            "slo_miss_rate": self.best.miss_rate,
            "feasible": self.feasible,
            "baselines": self.baselines,
            "search": {"evaluations": self.evaluations, "wall_s": self.wall_s, "steps": self.steps},
            "trace": self.trace,
        }


def provision_pipeline(
    planner: PipelinePlanner, *, models: Mapping[str, str | None] | None = None
) -> PipelineProvision:
    """Plan every stage of the planner's pipeline for its SLO end to end on its trace;
    ``models`` names each stage's model."""
    start = time.perf_counter()
    pipeline = planner.pipeline
    best, steps = planner.greedy()
    baselines = coarse_baselines(planner)
    plans = {}
    run = planner.run(best.configs)
    arrivals, capacity = {}, {}
    for name, c in zip(planner.names, best.configs, strict=True):
        model = (models or {}).get(name)
        opt = Optimizer(pipeline.stages[name].table, cpus=c.cpus, max_batch=c.batch, model=model)
        plans[name] = opt.plan(c.batch).to_dict()
        seen = run.arrive_ms[name]
        arrivals[name] = np.sort(seen[np.isfinite(seen)]) / 1000.0
        sp = planner.stage_planners[name]
        capacity[name] = float(sp.capacity(sp.instances(c.cpus, c.batch)))
    return PipelineProvision(
        pipeline=pipeline,
        best=best,
        plans=plans,
        scale=planner.scale,
        slo_ms=planner.slo_ms,
        baselines=baselines,
        evaluations=planner.evaluations,
        wall_s=time.perf_counter() - start,
        trace=trace_summary(planner.trace, planner.rate),
        steps=steps,
        stage_arrivals=arrivals,
        capacity=capacity,
    )
