"""validate_spec mirrors the CRD's CEL rules, which nothing evaluates offline."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.spec import (
    initial_batch,
    profile_key,
    serving_hash,
    validate_spec,
    with_defaults,
)

GOOD: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4}


def test_good_spec_is_valid() -> None:
    assert validate_spec(GOOD, name="tiny") == []
    assert (
        validate_spec(
            {
                "model": {"uri": "https://h/m.pt", "format": "torchscript"},
                "cpus": 4,
                "autoBatch": {},
            }
        )
        == []
    )


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({**GOOD, "model": {"zoo": "tiny", "uri": "https://h/m.mar"}}, "exactly one of model.zoo"),
        ({**GOOD, "model": {}}, "exactly one of model.zoo"),
        ({**GOOD, "model": {"uri": "https://h/m.mar"}}, "model.format is required"),
        ({**GOOD, "model": {"zoo": "tiny", "format": "mar"}}, "model.format applies only"),
        ({**GOOD, "autoBatch": {"min": 1, "max": 8}}, "exactly one of batchSize and autoBatch"),
        ({"model": {"zoo": "tiny"}, "cpus": 2}, "exactly one of batchSize and autoBatch"),
        ({**GOOD, "batchSize": 64}, "must not exceed profiling.maxBatch"),
        ({**GOOD, "profiling": {"threads": [1, 4]}}, "at most cpus"),
        ({**GOOD, "cpus": 0}, "spec.cpus must be an integer"),
        ({**GOOD, "cpus": True}, "spec.cpus must be an integer"),
        ({**GOOD, "colour": 1}, "spec.colour: unknown field"),
        ({**GOOD, "batchSize": None, "autoBatch": {"min": 9, "max": 8}}, "autoBatch.min"),
        (
            {**GOOD, "model": {"volume": {"path": "a.pt"}, "format": "torchscript"}},
            "persistentVolumeClaim and configMap",
        ),
        (
            {
                **GOOD,
                "model": {
                    "volume": {"configMap": {"name": "m"}, "path": "../etc/passwd"},
                    "format": "torchscript",
                },
            },
            "without '..'",
        ),
    ],
)
def test_invalid_specs(spec: dict[str, Any], needle: str) -> None:
    spec = {k: v for k, v in spec.items() if v is not None}
    errors = validate_spec(spec)
    assert any(needle in e for e in errors), errors


def test_name_length_checked() -> None:
    assert validate_spec(GOOD, name="x" * 41)
    assert validate_spec(GOOD, name="Bad_Name")


def test_defaults_and_batch() -> None:
    spec = with_defaults({"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": {"max": 8}})
    assert spec["replicas"] == 1
    assert spec["profiling"]["maxBatch"] == 32
    assert spec["autoBatch"]["min"] == 1
    assert initial_batch(spec) == 1
    assert initial_batch(GOOD) == 4


def test_profile_key_ignores_batch_but_not_cpus() -> None:
    a = profile_key(GOOD, image="img")
    assert profile_key({**GOOD, "batchSize": 8, "replicas": 3}, image="img") == a
    assert profile_key({**GOOD, "cpus": 4}, image="img") != a
    assert profile_key(GOOD, image="img2") != a


def test_serving_hash_ignores_replicas() -> None:
    plan = {"cpus": 2, "batch": 4, "instances": [{"threads": 1, "batch": 2, "count": 2}]}
    h = serving_hash(GOOD, plan=plan, image="i")
    assert serving_hash({**GOOD, "replicas": 5}, plan=plan, image="i") == h
    assert serving_hash(GOOD, plan={**plan, "batch": 8}, image="i") != h
