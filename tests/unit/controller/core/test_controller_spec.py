"""validate_spec mirrors the CRD's CEL rules, which nothing evaluates offline."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.model import AutoBatch, model_spec
from packrat.controller.core.spec import read_spec, validate_spec

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
        ({**GOOD, "runtime": "jvm"}, "spec.runtime must be one of native, torchserve"),
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
            "must not contain '..'",
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
    spec, errors = read_spec({"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": {"max": 8}})
    assert errors == []
    assert spec["replicas"] == 1
    assert spec["profiling"]["maxBatch"] == 32
    assert spec["autoBatch"]["min"] == 1
    assert model_spec(spec).fixed_batch == 1
    assert model_spec(GOOD).fixed_batch == 4


def test_the_typed_spec_has_every_option_typed_and_is_read_only() -> None:
    typed = model_spec(
        {"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": {"max": 8, "rounding": "floor"}},
        image="img:1",
    )
    assert typed.auto == AutoBatch(
        min=1,
        max=8,
        sustain_observations=3,
        min_interval_seconds=60.0,
        min_gain=0.05,
        rounding="floor",
    )
    assert typed.profiling.max_batch == 32 and typed.profiling.threads is None
    assert typed.switch.ready_timeout_seconds == 300.0 and typed.switch.drain_seconds == 10.0
    assert (typed.cpus, typed.memory, typed.replicas, typed.batch_size) == (2, "4Gi", 1, None)
    assert typed.image == "img:1" and "image" not in typed.spec  # resolved once, not stored
    assert typed.stored_spec()["image"] == "img:1"
    with pytest.raises(TypeError):
        typed.spec["cpus"] = 4  # type: ignore[index]
    with pytest.raises(TypeError):
        typed.source.doc["zoo"] = "resnet50"  # type: ignore[index]
    assert typed.source.zoo == "tiny" and typed.source.uri is None  # typed once
    served = typed.on_cpus(1)
    assert served.cpus == 1 and typed.cpus == 2 and served.profile_key != typed.profile_key


def test_profile_key_ignores_batch_but_not_cpus() -> None:
    a = model_spec(GOOD, image="img").profile_key
    assert model_spec({**GOOD, "batchSize": 8, "replicas": 3}, image="img").profile_key == a
    assert model_spec({**GOOD, "cpus": 4}, image="img").profile_key != a
    assert model_spec(GOOD, image="img2").profile_key != a


def test_serving_hash_ignores_replicas() -> None:
    plan = {"cpus": 2, "batch": 4, "instances": [{"threads": 1, "batch": 2, "count": 2}]}
    h = model_spec(GOOD, image="i").serving_hash(plan)
    assert model_spec({**GOOD, "replicas": 5}, image="i").serving_hash(plan) == h
    assert model_spec(GOOD, image="i").serving_hash({**plan, "batch": 8}) != h
