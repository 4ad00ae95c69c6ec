"""The spec's defaults come from the CRD's own ``default:`` values (``schema_defaults``), the
one source: the defaulter fills them in as the API server would, so a spec that did not pass
one (a test, an emulator, a YAML file) reads the same as one that did."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from packrat.controller.api.schema import MODEL_CRD, PIPELINE_CRD, crd_schema, schema_defaults
from packrat.controller.core.model import model_spec
from packrat.controller.core.slo_spec import Autoscaling, Slo
from packrat.controller.core.spec import read_spec

SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "slo": {"latencyP99Ms": 50, "rate": 10},
    "autoscaling": {"maxReplicas": 4},
}


AUTOSCALING = {
    "mode": "envelope",
    "minReplicas": 1,
    "maxReplicas": 10,
    "scaleDownDelaySeconds": 120,
    "intervalSeconds": 5,
}


def test_the_crd_states_the_defaults_python_wrote_by_hand_before() -> None:
    assert schema_defaults(MODEL_CRD, "spec", "autoscaling") == {
        **AUTOSCALING,
        "startupFloorSeconds": 0,
    }
    assert schema_defaults(MODEL_CRD, "spec", "slo") == {"cv": 1.0, "durationSeconds": 120}
    assert schema_defaults(MODEL_CRD, "spec", "autoBatch") == {
        "min": 1,
        "max": 32,
        "sustainObservations": 3,
        "minIntervalSeconds": 60,
        "minGain": 0.05,
        "sustainSeconds": 1,
    }
    assert schema_defaults(PIPELINE_CRD, "spec", "autoscaling") == AUTOSCALING  # no floor


def test_each_call_is_a_fresh_copy() -> None:
    first = schema_defaults(MODEL_CRD, "spec", "profiling")
    first["maxBatch"] = 1
    assert schema_defaults(MODEL_CRD, "spec", "profiling")["maxBatch"] == 32
    assert (
        crd_schema(MODEL_CRD)["properties"]["spec"]["properties"]["profiling"]["properties"][
            "maxBatch"
        ]["default"]
        == 32
    )


@pytest.mark.parametrize("part", ["autoscaling", "slo"])
def test_the_defaulter_fills_in_every_default_the_crd_states(part: str) -> None:
    spec, errors = read_spec(SPEC, name="m")
    assert errors == []
    expected = {**schema_defaults(MODEL_CRD, "spec", part), **SPEC[part]}
    assert spec[part] == expected  # a given value wins over the default
    assert spec["autoscaling"]["maxReplicas"] == 4


def test_a_spec_the_api_server_defaulted_reads_the_same() -> None:
    served = copy.deepcopy(SPEC)  # what the API server stores: every default filled in
    for part in ("autoscaling", "slo"):
        served[part] = {**schema_defaults(MODEL_CRD, "spec", part), **served[part]}
    assert model_spec(SPEC) == model_spec(served)
    # the typed parts fill them in too, for a part read without the defaulter
    bypassed = Autoscaling.of(SPEC["autoscaling"])
    assert bypassed == Autoscaling.of(served["autoscaling"])
    assert (bypassed.mode, bypassed.max_replicas, bypassed.interval_seconds) == ("envelope", 4, 5)
    assert Slo.of(SPEC["slo"]) == Slo.of(served["slo"]) and Slo.of(SPEC["slo"]).cv == 1.0
