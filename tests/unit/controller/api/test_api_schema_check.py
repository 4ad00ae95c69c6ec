"""The spec checks derived from the CRD (packrat.controller.api.schema): one test per rule
family (type, range, enum, pattern, length, required, unknown field, list, CEL), through
``validate_spec`` as the operator runs it, and the explicit mapping of the Kubernetes
extensions to JSON Schema."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.api.cel import READINGS, rules_at
from packrat.controller.api.schema import (
    MODEL_CRD,
    PIPELINE_CRD,
    SchemaCheck,
    crd_schema,
    schema_check,
    to_json_schema,
)
from packrat.controller.core.spec import validate_spec

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}


def errors_with(**changes: Any) -> list[str]:
    return validate_spec({**BASE, **changes}, name="m")


def test_a_valid_spec_has_no_errors() -> None:
    assert errors_with() == []
    assert errors_with(runtime=None) == []  # null is pruned, as the API server does


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # type
        ({"cpus": "2"}, "spec.cpus must be an integer in 1..256, got '2'"),
        ({"cpus": True}, "spec.cpus must be an integer in 1..256, got True"),
        ({"profiling": "fast"}, "spec.profiling must be an object, got 'fast'"),
        ({"nodeSelector": {"a": 1}}, "spec.nodeSelector.a must be a string, got 1"),
        # range
        ({"cpus": 0}, "spec.cpus must be an integer in 1..256, got 0"),
        ({"profiling": {"precision": 0}}, "spec.profiling.precision must be a number in (0, 1]"),
        ({"replicas": 101}, "spec.replicas must be an integer in 0..100, got 101"),
        # enum
        ({"runtime": "jvm"}, "spec.runtime must be one of native, torchserve, got 'jvm'"),
        ({"model": {"zoo": "vgg"}}, "spec.model.zoo must be one of resnet50, inception_v3,"),
        # pattern (Go's `$`: no final newline)
        ({"memory": "4 GB"}, "spec.memory must match ^[0-9]+"),
        ({"memory": "4Gi\n"}, "spec.memory must match ^[0-9]+"),
        ({"pool": "a\n"}, "spec.pool must match ^[a-z]$|"),  # `$` inside alternatives too
        # length
        ({"image": ""}, "spec.image must be a non-empty string of at most 512 characters"),
        # required
        ({"cpus": None}, "spec.cpus is required"),
        ({"slo": {"rate": 5}, "batchSize": None}, "spec.slo.latencyP99Ms is required"),
        # unknown field (an object with properties takes no others)
        ({"bogus": 1}, "spec.bogus: unknown field"),
        ({"switch": {"drain": 1}}, "spec.switch.drain: unknown field"),
        # lists
        ({"profiling": {"threads": [1, 1]}}, "spec.profiling.threads must not repeat a value"),
        ({"profiling": {"threads": []}}, "spec.profiling.threads must have 1..256 items, got 0"),
        # CEL, with the CRD's message at the rule's place
        ({"autoBatch": {"max": 4}}, "spec: exactly one of batchSize and autoBatch must be set"),
        ({"batchSize": 64}, "spec: batchSize must not exceed profiling.maxBatch"),
        (
            {"batchSize": None, "autoBatch": {"min": 8, "max": 4}},
            "spec.autoBatch: autoBatch.min must not exceed autoBatch.max",
        ),
        # not JSON, but YAML can say it: NaN passes every bound
        ({"profiling": {"precision": float("nan")}}, "must be a finite number, got nan"),
    ],
)
def test_each_rule_family_names_the_field_and_the_rule(
    changes: dict[str, Any], message: str
) -> None:
    spec = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    errors = validate_spec(spec, name="m")
    assert any(message in e for e in errors), errors


def test_one_message_per_violation() -> None:
    # a wrong type breaks the type and the range: one message; a bad URI breaks the CRD's
    # pattern and the fetch's parser: the parser's message, which says what is wrong
    assert errors_with(cpus="x") == ["spec.cpus must be an integer in 1..256, got 'x'"]
    bad = {"storageUri": "s3://bucket/dir/", "format": "torchscript"}
    assert errors_with(model=bad) == [
        "spec.model.storageUri must name one file, got 's3://bucket/dir/'"
    ]


@pytest.mark.parametrize("field", ["model", "slo", "autoscaling", "canary"])
def test_a_value_of_the_wrong_type_is_one_message_not_its_rules_as_well(field: str) -> None:
    # a string where an object belongs: the type, once; not "exactly one of model.zoo, ..."
    # and the other rules of the object it is not (the API server binds no rule to it)
    batch = {"batchSize": None} if field == "slo" else {}  # slo chooses the batch itself
    assert errors_with(**{field: "resnet50"}, **batch) == [
        f"spec.{field} must be an object, got 'resnet50'"
    ]
    assert errors_with(model=["resnet50"]) == ["spec.model must be an object, got ['resnet50']"]


def test_a_canary_model_is_checked_against_spec_models_schema() -> None:
    canary = {"model": {"zoo": "vgg"}, "trafficPercent": 10}
    assert errors_with(canary=canary) == [
        "spec.canary.model.zoo must be one of resnet50, inception_v3, bert-base, gpt2, tiny, "
        "got 'vgg'"
    ]


def test_kubernetes_extensions_map_explicitly() -> None:
    schema = to_json_schema(
        {
            "type": "object",
            "properties": {
                "port": {"x-kubernetes-int-or-string": True},
                "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "ids": {"type": "array", "x-kubernetes-list-type": "set"},
                "note": {"type": "string", "nullable": True, "pattern": "^a$"},
            },
        }
    )
    assert schema["additionalProperties"] is False
    assert schema["properties"]["port"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert "additionalProperties" not in schema["properties"]["open"]
    assert schema["properties"]["ids"]["uniqueItems"] is True
    assert schema["properties"]["note"] == {"type": ["string", "null"], "pattern": "^a\\Z"}
    check = SchemaCheck(
        {"type": "object", "properties": {"p": {"x-kubernetes-int-or-string": True}}}
    )
    assert check.errors({"p": 8080}, "x") == check.errors({"p": "http"}, "x") == []
    assert check.errors({"p": 1.5}, "x") != []


@pytest.mark.parametrize("crd", [MODEL_CRD, PIPELINE_CRD])
def test_every_cel_rule_of_the_packaged_crds_has_a_reading(crd: str) -> None:
    # a rule added to a CRD without a Python reading would raise KeyError in the operator
    found = [rule["rule"] for rule, _, _ in _every_rule(crd_schema(crd))]
    assert found
    assert [r for r in found if r not in READINGS] == []


def _every_rule(schema: Any) -> list[Any]:
    """Every CEL rule under ``schema`` (bound to a placeholder: the walk's own test)."""
    out = [(r, None, "") for r in schema.get("x-kubernetes-validations") or []]
    for sub in (schema.get("properties") or {}).values():
        out += _every_rule(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += _every_rule(schema[key])
    return out


def test_rules_bind_self_to_every_element() -> None:
    env = {"env": [{"name": "A", "value": "1"}, {"name": "B"}]}
    node = crd_schema(MODEL_CRD)["properties"]["spec"]["properties"]["pod"]
    bound = [(r["rule"], where) for r, _, where in rules_at(node, env, "spec.pod")]
    value_rule = "has(self.value) != has(self.valueFrom)"
    assert (value_rule, "spec.pod.env[1]") in bound
    assert schema_check(MODEL_CRD, "spec", "pod").errors(env, "spec.pod") == [
        "spec.pod.env[1]: set exactly one of value and valueFrom"
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bogus": 1}, "spec.bogus: unknown field"),
        ({"deadlineMs": 0}, "spec.deadlineMs must be an integer in 1..3600000, got 0"),
        ({"edges": [{"from": "first", "to": "second", "fraction": 2}]}, "fraction must be"),
        ({"edges": [{"from": "first", "to": "first"}]}, "spec.edges[0]: an edge cannot lead"),
        ({"stages": []}, "spec.stages must have 1..16 items, got 0"),
    ],
)
def test_a_pipeline_spec_is_checked_against_its_crd(changes: dict[str, Any], message: str) -> None:
    from pipeline_support import pipeline_body

    from packrat.controller.core.model import InvalidSpec
    from packrat.controller.pipeline.spec import parse_pipeline

    with pytest.raises(InvalidSpec) as info:
        parse_pipeline(pipeline_body(**changes))
    assert message in str(info.value)
    parse_pipeline(pipeline_body())  # the valid one parses
