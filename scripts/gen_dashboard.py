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

S = 'namespace=~"$namespace", model=~"$model"'  # every panel's selector
R = "$__rate_interval"


def _q(quantile: float, metric: str, by: str) -> str:
    return f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket{{{S}}}[{R}])))"


# (row, title, unit, [(legend, expr)], description)
PANELS: list[tuple[str, str, str, list[tuple[str, str]], str]] = [
    (
        "Serving",
        "Request rate by status code",
        "reqps",
        [
            (
                "{{namespace}}/{{model}} {{code}}",
                f"sum by (namespace, model, code) (rate(packrat_requests_total{{{S}}}[{R}]))",
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
                "p50 {{namespace}}/{{model}}",
                _q(0.5, "packrat_request_duration_seconds", "namespace, model"),
            ),
            (
                "p99 {{namespace}}/{{model}}",
                _q(0.99, "packrat_request_duration_seconds", "namespace, model"),
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
                "p50 {{model}} {{plan_instance}}",
                _q(
                    0.5,
                    "packrat_instance_request_duration_seconds",
                    "namespace, model, plan_instance",
                ),
            ),
            (
                "p99 {{model}} {{plan_instance}}",
                _q(
                    0.99,
                    "packrat_instance_request_duration_seconds",
                    "namespace, model, plan_instance",
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
                "measured p50 {{namespace}}/{{model}}",
                _q(0.5, "packrat_instance_request_duration_seconds", "namespace, model"),
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
                "{{model}} {{plan_instance}}",
                "sum by (namespace, model, plan_instance) "
                f"(rate(packrat_instance_requests_total{{{S}}}[{R}]))",
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
                "queued {{namespace}}/{{model}}",
                f"sum by (namespace, model) (packrat_queue_depth{{{S}}})",
            ),
            (
                "in flight {{namespace}}/{{model}}",
                f"sum by (namespace, model) (packrat_requests_in_flight{{{S}}})",
            ),
            (
                "queue limit {{namespace}}/{{model}}",
                f"sum by (namespace, model) (packrat_queue_limit{{{S}}})",
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
                "{{namespace}}/{{model}}",
                "sum by (namespace, model) (rate(packrat_request_errors_total"
                f'{{{S}, source="dispatcher", code="503"}}[{R}])) / sum by (namespace, model) '
                f"(rate(packrat_requests_total{{{S}}}[{R}]))",
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
                "estimate {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_batch_size_estimate{{{S}}})",
            ),
            (
                "plan {{namespace}}/{{model}}",
                f"max by (namespace, model) (packrat_plan_batch_size{{{S}}})",
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
                "ready {{namespace}}/{{model}}",
                f"sum by (namespace, model) (packrat_instance_up{{{S}}})",
            ),
            (
                "planned {{namespace}}/{{model}}",
                f"count by (namespace, model) (packrat_instance_up{{{S}}})",
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
        "description": "Serving latency, load, plans, switches and profiling of PackratModels.",
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
