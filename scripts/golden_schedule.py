"""The next-pass decisions :mod:`golden_controller` records: for a grid of models, stored
statuses and pass results, the delay the model daemon chooses, whether it reads estimates
and arrivals before the pass, and whether it looks at the pods between passes."""

from __future__ import annotations

import itertools
from typing import Any

from packrat.controller import handlers as h
from packrat.controller.core.context import Again
from packrat.controller.core.model import parse
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning import schedule

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}}
AUTO = {"min": 1, "max": 8, "sustainObservations": 2}
SLO = {"latencyP99Ms": 20, "rate": 2000, "durationSeconds": 4}
SPECS: dict[str, dict[str, Any]] = {
    "fixed": {**BASE, "batchSize": 4},
    "auto": {**BASE, "autoBatch": AUTO},
    "auto-fast": {**BASE, "autoBatch": {**AUTO, "sustainSeconds": 0.2}},
    "auto-fast-slow": {**BASE, "autoBatch": {**AUTO, "sustainSeconds": 7}},
    "slo-envelope": {**BASE, "slo": SLO, "autoscaling": {}},
    "slo-interval": {**BASE, "slo": SLO, "autoscaling": {"intervalSeconds": 2}},
    "slo-external": {**BASE, "slo": SLO, "autoscaling": {"mode": "external"}},
    "slo-auto": {**BASE, "slo": SLO, "autoBatch": {**AUTO, "sustainSeconds": 1}, "autoscaling": {}},
    "ingress": {
        **BASE,
        "slo": SLO,
        "autoscaling": {"ingress": {"service": "pipe", "scaleFactor": 0.5}},
    },
    "storage": {**BASE, "batchSize": 4, "model": {"storageUri": "s3://b/m.pt2"}},
    "invalid": {**BASE, "cpus": -1},
}
STATUSES: dict[str, dict[str, Any]] = {
    "none": {},
    "ready": {"phase": "Ready"},
    "switching": {"phase": "Reconfiguring", "switch": {"stage": "rollout"}},
    "aborted": {"phase": "Ready", "switch": {"stage": "aborted"}},
}
READINGS: dict[str, ab.Reading | None] = {
    "none": None,
    "pods": ab.Reading((4, 4), "pods"),
    "service": ab.Reading((4,), "service"),
}


def decisions() -> list[dict[str, Any]]:
    options = h.OperatorOptions()
    out: list[dict[str, Any]] = []
    grid = itertools.product(SPECS, STATUSES, (False, True), (None, 3.0, 0.1), READINGS)
    for spec, stat, waiting, retry, reading_name in grid:
        body = {
            "apiVersion": "packrat.dev/v1alpha1",
            "kind": "PackratModel",
            "metadata": {"name": "tiny", "namespace": "ns"},
            "spec": SPECS[spec],
            "status": STATUSES[stat],
        }
        model = h.typed(body, options)
        reading = READINGS[reading_name]
        before = schedule.before_pass(model, body["status"])
        wait = schedule.next_pass(
            options.cadence, before, Again(waiting=waiting, within=retry), reading
        )
        out.append(
            {
                "case": f"{spec}/{stat}/waiting={waiting}/retry={retry}/reading={reading_name}",
                "valid": model is not None and parse(body) is not None,
                "estimates": before.estimates,
                "arrivals": before.arrivals,
                "ingress": before.ingress,
                "delay": wait.delay,
                "peek_every": wait.peek_every,
            }
        )
    return out
