"""Generate the Grafana dashboard (helm/packrat-operator/dashboards/packrat.json).

The panels and their PromQL live here, in one list; the JSON is generated so that the chart's
ConfigMap, the docs and the Prometheus test (tests/integration/test_prometheus.py, which
evaluates every query against a real Prometheus) all read the same queries.

    python scripts/gen_dashboard.py           # rewrite the JSON
    python scripts/gen_dashboard.py --check   # exit 1 when the JSON is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "helm" / "packrat-operator" / "dashboards" / "packrat.json"
UID = "packrat-operator"

# The operator's series name the PackratModel in `model`; the serving pods' series carry the
# served model's name there (spec.model.name when set), and the PackratModel in
# `packratmodel`, which the chart's PodMonitor adds from the pod's app.kubernetes.io/instance
# label. So the $model variable (PackratModel names) selects `model` on operator series and
# `packratmodel` on pod series, and pod panels group by `packratmodel`.
S = 'namespace=~"$namespace", model=~"$model"'  # operator series
P = 'namespace=~"$namespace", packratmodel=~"$model"'  # serving-pod series
L = 'namespace=~"$namespace", pipeline=~"$pipeline"'  # pipeline routers' series
R = "$__rate_interval"


def _q(quantile: float, metric: str, by: str, sel: str = P) -> str:
    return (
        f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[{R}])))"
    )


# (row, title, unit, [(legend, expr)], description)
PANELS: list[tuple[str, str, str, list[tuple[str, str]], str]] = [
    (
        "Serving",
        "Request rate by status code",
        "reqps",
        [
            (
                "{{namespace}}/{{packratmodel}} {{code}}",
                "sum by (namespace, packratmodel, code) "
                f"(rate(packrat_requests_total{{{P}}}[{R}]))",
            )
        ],
        "Prediction requests answered per second, by HTTP status (all serving pods).",
    ),
    (
        "Serving",
        "Request latency p50 / p99 per model",
        "s",
        [
            (
                "p50 {{namespace}}/{{packratmodel}}",
                _q(0.5, "packrat_request_duration_seconds", "namespace, packratmodel"),
            ),
            (
                "p99 {{namespace}}/{{packratmodel}}",
                _q(0.99, "packrat_request_duration_seconds", "namespace, packratmodel"),
            ),
        ],
        "Dispatcher view: from receiving a request to answering it, queueing included.",
    ),
    (
        "Serving",
        "Latency p50 / p99 per plan instance",
        "s",
        [
            (
                "p50 {{packratmodel}} {{plan_instance}}",
                _q(
                    0.5,
                    "packrat_instance_request_duration_seconds",
                    "namespace, packratmodel, plan_instance",
                ),
            ),
            (
                "p99 {{packratmodel}} {{plan_instance}}",
                _q(
                    0.99,
                    "packrat_instance_request_duration_seconds",
                    "namespace, packratmodel, plan_instance",
                ),
            ),
        ],
        "Time TorchServe took per thin instance (batch latency plus batching delay).",
    ),
    (
        "Serving",
        "Measured vs expected batch latency",
        "s",
        [
            (
                "measured p50 {{namespace}}/{{packratmodel}}",
                _q(0.5, "packrat_instance_request_duration_seconds", "namespace, packratmodel"),
            ),
            (
                "expected {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_model_expected_latency_seconds{{{S}}})",
            ),
        ],
        "The instances' measured median against the plan's expected batch latency "
        "(the optimizer's number). A gap means interference: shared cores, noisy neighbours.",
    ),
    (
        "Serving",
        "Requests per plan instance",
        "reqps",
        [
            (
                "{{packratmodel}} {{plan_instance}}",
                "sum by (namespace, packratmodel, plan_instance) "
                f"(rate(packrat_instance_requests_total{{{P}}}[{R}]))",
            )
        ],
        "The dispatcher's split across thin instances, proportional to their batch sizes.",
    ),
    (
        "Load",
        "Queue depth and in-flight requests",
        "short",
        [
            (
                "queued {{namespace}}/{{packratmodel}}",
                f"sum by (namespace, packratmodel) (packrat_queue_depth{{{P}}})",
            ),
            (
                "in flight {{namespace}}/{{packratmodel}}",
                f"sum by (namespace, packratmodel) (packrat_requests_in_flight{{{P}}})",
            ),
            (
                "queue limit {{namespace}}/{{packratmodel}}",
                f"sum by (namespace, packratmodel) (packrat_queue_limit{{{P}}})",
            ),
        ],
        "Requests waiting in the dispatchers and forwarded to TorchServe, against the limit.",
    ),
    (
        "Load",
        "Shed ratio",
        "percentunit",
        [
            (
                "{{namespace}}/{{packratmodel}}",
                "sum by (namespace, packratmodel) (rate(packrat_request_errors_total"
                f'{{{P}, source="dispatcher", code="503"}}[{R}])) '
                "/ sum by (namespace, packratmodel) "
                f"(rate(packrat_requests_total{{{P}}}[{R}]))",
            )
        ],
        "Share of requests the dispatchers answered 503 (queue full, draining, no instance).",
    ),
    (
        "Load",
        "Batch size: estimate, plan, observed",
        "short",
        [
            (
                "estimate {{namespace}}/{{packratmodel}}",
                f"max by (namespace, packratmodel) (packrat_batch_size_estimate{{{P}}})",
            ),
            (
                "plan {{namespace}}/{{packratmodel}}",
                f"max by (namespace, packratmodel) (packrat_plan_batch_size{{{P}}})",
            ),
            (
                "operator observed {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_model_observed_batch_size{{{S}}})",
            ),
        ],
        "Packrat's batch-size estimate from the queue against the batch size the running plan "
        "was made for; autoBatch switches plans when they differ for long enough.",
    ),
    (
        "Load",
        "Plan instances ready",
        "short",
        [
            (
                "ready {{namespace}}/{{packratmodel}}",
                f"sum by (namespace, packratmodel) (packrat_instance_up{{{P}}})",
            ),
            (
                "planned {{namespace}}/{{packratmodel}}",
                f"count by (namespace, packratmodel) (packrat_instance_up{{{P}}})",
            ),
        ],
        "Thin instances loaded, warmed and ready, out of all instances of the serving pods.",
    ),
    (
        "Operator",
        "Phase",
        "short",
        [
            (
                "{{namespace}}/{{model}} {{phase}}",
                f"max by (namespace, model, phase) (packrat_model_phase{{{S}}}) > 0",
            )
        ],
        "The PackratModel's status.phase over time.",
    ),
    (
        "Operator",
        "Switches",
        "short",
        [
            (
                "{{namespace}}/{{model}} {{result}}",
                "sum by (namespace, model, result) "
                f"(increase(packrat_operator_switches_total{{{S}}}[1h]))",
            )
        ],
        "Active-passive slot switches in the last hour, succeeded and aborted.",
    ),
    (
        "Operator",
        "Switch duration (mean of completed switches)",
        "s",
        [
            (
                "{{namespace}}/{{model}}",
                f"sum by (namespace, model) (packrat_operator_switch_duration_seconds_sum{{{S}}}) "
                "/ sum by (namespace, model) "
                f"(packrat_operator_switch_duration_seconds_count{{{S}}})",
            )
        ],
        "Seconds from the start of a switch to the Service selecting the new slot.",
    ),
    (
        "Operator",
        "Profiling progress",
        "percentunit",
        [
            (
                "{{namespace}}/{{model}}",
                f"packrat_model_profiling_points_done{{{S}}} "
                f"/ packrat_model_profiling_points{{{S}}}",
            ),
        ],
        "Points measured by the running profiling Job (status.profiling.progress).",
    ),
    (
        "Operator",
        "Profiling ETA and duration",
        "s",
        [
            ("ETA {{namespace}}/{{model}}", f"packrat_model_profiling_eta_seconds{{{S}}}"),
            (
                "last duration {{namespace}}/{{model}}",
                "sum by (namespace, model) "
                f"(packrat_operator_profiling_duration_seconds_sum{{{S}}})"
                " / sum by (namespace, model) "
                f"(packrat_operator_profiling_duration_seconds_count{{{S}}})",
            ),
        ],
        "The profiler's estimate of the time left, and the mean duration of finished Jobs.",
    ),
    (
        "Operator",
        "Warning events",
        "short",
        [
            (
                "{{namespace}}/{{model}} {{reason}}",
                "sum by (namespace, model, reason) "
                f'(increase(packrat_operator_events_total{{{S}, type="Warning"}}[1h]))',
            )
        ],
        "Warning Events the operator posted in the last hour (ProfilingFailed, SwitchAborted...).",
    ),
    (
        "Operator",
        "Expected speedup of the active plan",
        "short",
        [
            (
                "{{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_model_expected_speedup{{{S}}})",
            )
        ],
        "The optimizer's L(T, B) / plan latency: an expectation, not a measurement.",
    ),
    (
        "Operator",
        "Cores exclusive (isolation check)",
        "short",
        [
            (
                "{{namespace}}/{{model}}",
                f"min by (namespace, model) (packrat_cores_exclusive{{{S}}})",
            )
        ],
        "1 when the profiling pod's isolation check found the serving nodes' cores exclusive "
        "(static CPU manager), 0 when shared or busy (condition CoresExclusive; alert "
        "PackratCoresNotExclusive).",
    ),
    (
        "Tuner",
        "Arrival envelope vs capacity",
        "reqps",
        [
            (
                "envelope {{window_seconds}}s {{namespace}}/{{model}}",
                f"max by (namespace, model, window_seconds) (packrat_tuner_envelope_rate{{{S}}})",
            ),
            (
                "capacity {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_tuner_capacity{{{S}}})",
            ),
        ],
        "spec.autoscaling (envelope): the highest arrival rate in any window of each length "
        "against what the replicas the tuner wants sustain. A window above capacity scales up.",
    ),
    (
        "Tuner",
        "Replicas and decisions",
        "short",
        [
            (
                "wanted {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_tuner_replicas{{{S}}})",
            ),
            (
                "{{action}} {{namespace}}/{{model}}",
                "sum by (namespace, model, action) "
                f"(increase(packrat_tuner_decisions_total{{{S}}}[1h]))",
            ),
        ],
        "The replica count the tuner decided on, and its decisions in the last hour "
        "(scale_up, scale_down, hold).",
    ),
    (
        "Pipelines",
        "Pipeline queries by status code",
        "reqps",
        [
            (
                "{{namespace}}/{{pipeline}} {{code}}",
                "sum by (namespace, pipeline, code) "
                f"(rate(packrat_pipeline_requests_total{{{L}}}[{R}]))",
            )
        ],
        "Queries the pipelines' routers answered per second, by HTTP status.",
    ),
    (
        "Pipelines",
        "Pipeline latency p50 / p99 (end to end)",
        "s",
        [
            (
                "p50 {{namespace}}/{{pipeline}}",
                _q(0.5, "packrat_pipeline_request_duration_seconds", "namespace, pipeline", L),
            ),
            (
                "p99 {{namespace}}/{{pipeline}}",
                _q(0.99, "packrat_pipeline_request_duration_seconds", "namespace, pipeline", L),
            ),
        ],
        "From the router receiving a query to its answer, every stage on the query's path "
        "included: the number the pipeline's SLO is about.",
    ),
    (
        "Pipelines",
        "Stage latency p99",
        "s",
        [
            (
                "{{pipeline}} {{stage}}",
                _q(
                    0.99,
                    "packrat_pipeline_stage_duration_seconds",
                    "namespace, pipeline, stage",
                    L,
                ),
            )
        ],
        "Time each stage's Service took to answer the router.",
    ),
    (
        "Pipelines",
        "Stage failures by reason",
        "reqps",
        [
            (
                "{{pipeline}} {{stage}} {{reason}}",
                "sum by (namespace, pipeline, stage, reason) "
                f"(rate(packrat_pipeline_stage_failures_total{{{L}}}[{R}]))",
            )
        ],
        "Queries failed at a stage: its status (4xx, 503 shed), unreachable, or the deadline.",
    ),
]


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def build() -> dict[str, Any]:
    """The dashboard as a dict (Grafana's JSON model, schemaVersion 39)."""
    panels: list[dict[str, Any]] = []
    y, row, pid = 0, None, 1
    col = 0
    for group, title, unit, targets, description in PANELS:
        if group != row:
            if col:
                y += 8
            col = 0
            panels.append(
                {
                    "type": "row",
                    "id": pid,
                    "title": group,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            pid, y, row = pid + 1, y + 1, group
        panels.append(
            {
                "type": "timeseries",
                "id": pid,
                "title": title,
                "description": description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": col * 12, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for i, (legend, expr) in enumerate(targets)
                ],
            }
        )
        pid += 1
        col = 1 - col
        if col == 0:
            y += 8
    return {
        "uid": UID,
        "title": "Packrat operator",
        "description": "Serving latency, load, plans, switches, profiling, the tuner and "
        "pipelines of PackratModels and PackratPipelines.",
        "tags": ["packrat", "pytorch", "inference"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "label_values(packrat_model_phase, namespace)"),
                _variable(
                    "model", 'label_values(packrat_model_phase{namespace=~"$namespace"}, model)'
                ),
                _variable(
                    "pipeline",
                    'label_values(packrat_pipeline_requests_total{namespace=~"$namespace"}, '
                    "pipeline)",
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `make dashboards`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
