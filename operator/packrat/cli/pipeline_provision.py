"""``packrat provision --pipeline FILE``: every stage's replicas, cores and batch for one
end-to-end P99 SLO, with the coarse-grained baselines (the pipeline replicated as a unit).

Not a subcommand of its own: :mod:`packrat.cli.provision` hands ``--pipeline`` runs here.
Pure (no torch). Exit status 0 when the SLO is met, 1 when it cannot be, 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from packrat.cli import CliError
from packrat.cli.heartbeat import heartbeat
from packrat.cli.provision import (
    infeasible_line,
    ms,
    print_result,
    sim_from_args,
    trace_from_args,
    trace_line,
)
from packrat.plan.pipeline.provision import PipelineProvision, provision_pipeline
from packrat.plan.pipeline.search import PipelinePlanner
from packrat.plan.pipeline.simulate import Pipeline, PipelineError
from packrat.plan.pipeline.spec import load_pipeline_spec
from packrat.plan.provision import ProvisionError
from packrat.plan.traces import TraceError


def run_pipeline(args: argparse.Namespace) -> int:
    try:
        spec = load_pipeline_spec(args.pipeline)
        trace = trace_from_args(args)
    except (PipelineError, TraceError) as exc:
        raise CliError(str(exc)) from None
    slo = args.slo_p99_ms if args.slo_p99_ms is not None else spec.slo_ms
    if slo is None:
        raise CliError(f"{args.pipeline}: no slo.latencyP99Ms in the file; give --slo-p99-ms")
    pipeline = spec.pipeline
    if args.max_cpus is not None:  # a cap on every stage's replica size
        pipeline = Pipeline(
            [
                dataclasses.replace(s, max_cpus=min(s.cpus, args.max_cpus))
                for s in pipeline.stages.values()
            ],
            pipeline.edges,
        )
    stages = len(pipeline.stages)
    try:
        with heartbeat(lambda: f"provision: {stages} stages on {trace.size} arrivals"):
            planner = PipelinePlanner(
                pipeline, trace, slo_ms=slo, max_cores=args.max_cores, sim=sim_from_args(args)
            )
            result = provision_pipeline(planner, models=spec.models)
    except ProvisionError as exc:
        raise CliError(str(exc)) from None
    return print_result(args, result, format_pipeline_table(result))


def format_pipeline_table(result: PipelineProvision) -> str:
    doc: dict[str, Any] = result.to_dict()
    lines = [
        trace_line(doc, "end-to-end SLO"),
        f"{'stage':14}{'visits':>7}{'replicas':>9}{'cpus':>6}{'batch':>7}{'cores':>7}"
        f"{'P99 ms':>9}  plan per replica",
    ]
    for s in doc["stages"]:
        lines.append(
            f"{s['name']:14}{s['scale_factor']:>7.2f}{s['replicas']:>9}{s['cpus_per_replica']:>6}"
            f"{s['batch']:>7}{s['cores']:>7}{ms(s['stage_p99_ms']):>9}  {s['plan']['label']}"
        )
    lines.append("")
    lines.append(f"{'config':14}{'cores':>7}{'P99 ms':>10}{'miss %':>8}  feasible")
    rows = [("planned", doc)] + [(f"CG-{k}", v) for k, v in doc["baselines"].items()]
    for name, row in rows:
        lines.append(
            f"{name:14}{row['cores']:>7}{ms(row['simulated_p99_ms']):>10}"
            f"{100 * row['slo_miss_rate']:>8.2f}  {'yes' if row['feasible'] else 'NO'}"
        )
    for k, v in doc["baselines"].items():
        per = ", ".join(f"{s['name']} {s['cpus_per_replica']}c/b{s['batch']}" for s in v["stages"])
        lines.append(f"CG-{k}: {v['units']} unit(s) of [{per}]")
    lines.append(
        f"search: {doc['search']['evaluations']} pipeline simulations in "
        f"{doc['search']['wall_s']:.2f} s"
    )
    if not doc["feasible"]:
        lines.append(f"{infeasible_line(doc)} ({'; '.join(doc['search']['steps'][-1:])})")
    return "\n".join(lines)
