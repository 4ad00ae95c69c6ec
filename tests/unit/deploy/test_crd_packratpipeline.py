"""The PackratPipeline CRD: valid for Kubernetes, its example validates against it (and its
stages against the PackratModel schema), and its CEL rules accept the example and reject
what they are for, evaluated for real with cel-python."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import kubernetes_validate
import pytest
from openapi_schema_validator import OAS30Validator
from packaging_support import (
    CRD_DIR,
    EXAMPLES_DIR,
    crd_schema,
    load_yaml_docs,
    strict_schema,
)

CRD_PATH = CRD_DIR / "packratpipeline.yaml"
CRD = load_yaml_docs(CRD_PATH)[0]
SCHEMA = crd_schema(CRD_PATH)
EXAMPLE = load_yaml_docs(EXAMPLES_DIR / "pipelines" / "cascade.yaml")[0]


def validator() -> OAS30Validator:
    schema = strict_schema(SCHEMA)
    schema["properties"]["metadata"] = {"type": "object"}
    return OAS30Validator(schema)


def errors(obj: Mapping[str, Any]) -> list[str]:
    return [e.message for e in validator().iter_errors(obj)]


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_crd_is_valid_kubernetes(version: str) -> None:
    kubernetes_validate.validate(CRD, version, strict=True)
    assert CRD["spec"]["names"]["kind"] == "PackratPipeline"
    columns = {c["name"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Ready", "Phase", "SLO", "Simulated", "Measured", "Cores", "Age"} <= columns


def test_the_example_validates_and_its_stages_are_packrat_models() -> None:
    assert errors(EXAMPLE) == []
    model_spec = strict_schema(crd_schema()["properties"]["spec"])
    for stage in EXAMPLE["spec"]["stages"]:
        assert list(OAS30Validator(model_spec).iter_errors(stage["model"])) == []


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda s: s.update(stages=[]), "no stages"),
        (lambda s: s["stages"][0].update(name="Screen"), "not a DNS label"),
        (lambda s: s["edges"][0].update(fraction=1.5), "fraction above 1"),
        (lambda s: s["slo"].update(latencyP99Ms=0), "SLO of 0 ms"),
        (lambda s: s.update(replicas=3), "unknown spec field"),
        (lambda s: s["stages"][0].pop("model"), "stage without a model"),
    ],
)
def test_the_schema_rejects_broken_pipelines(mutate: Any, why: str) -> None:
    broken = copy.deepcopy(EXAMPLE)
    mutate(broken["spec"])
    assert errors(broken), why


def rules_at(schema: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[Any]:
    for item in schema.get("x-kubernetes-validations") or []:
        yield path, item["rule"]
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules_at(sub, (*path, name))
    if isinstance(schema.get("items"), Mapping):
        yield from rules_at(schema["items"], (*path, "[]"))


RULES = list(rules_at(SCHEMA))
ENV = celpy.Environment()


def selves(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield value
    elif path[0] == "[]":
        for item in value if isinstance(value, list) else []:
            yield from selves(item, path[1:])
    elif isinstance(value, dict) and path[0] in value:
        yield from selves(value[path[0]], path[1:])


def failing(obj: Mapping[str, Any]) -> set[str]:
    """The rules ``obj`` breaks (each evaluated on every value it applies to)."""
    out = set()
    for path, rule in RULES:
        program = ENV.program(ENV.compile(rule))
        for value in selves(obj, path):
            result = program.evaluate({"self": celpy.json_to_cel(value)})
            assert not isinstance(result, Exception), (rule, result)
            if not bool(result):
                out.add(rule)
    return out


def test_the_example_passes_every_rule() -> None:
    assert len(RULES) == 9
    assert failing(EXAMPLE) == set()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda o: o["metadata"].update(name="a-very-long-pipeline-name"), "metadata.name"),
        (lambda o: o["spec"]["edges"][0].update(to="nowhere"), "self.stages.exists"),
        (lambda o: o["spec"]["edges"][0].update(to="screen"), "self.from != self.to"),
        (lambda o: o["spec"]["stages"][1]["model"].update(batchSize=8), "batchSize"),
        (
            lambda o: (
                o["spec"]["stages"][1].update(name="router"),
                o["spec"]["edges"][0].update(to="router"),
            ),
            "'router'",
        ),
        (
            lambda o: o["spec"]["slo"].update(trace={"configMap": "t", "key": "k"}),
            "has(self.trace)",
        ),
        (
            lambda o: o["spec"].update(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
            "self.minReplicas <= self.maxReplicas",
        ),
        (lambda o: o["spec"]["stages"][1]["model"].update(autoscaling={}), "autoscaling"),
        (
            lambda o: o["spec"]["edges"][0].update(when={"header": "h", "json": "a", "equals": 1}),
            "has(self.header) != has(self.json)",
        ),
        (
            lambda o: o["spec"]["edges"][0].update(when={"json": "a", "below": 1, "above": 0}),
            "has(self.equals)",
        ),
    ],
)
def test_each_rule_rejects_what_it_is_for(mutate: Any, needle: str) -> None:
    broken = copy.deepcopy(EXAMPLE)
    mutate(broken)
    broke = failing(broken)
    assert len(broke) == 1 and needle in next(iter(broke)), broke
    # the operator's Python reading of each rule (packrat.controller.api.cel) agrees
    from packrat.controller.api.cel import READINGS

    read = {r for path, r in RULES for v in selves(broken, path) if not READINGS[r](v)}
    assert read == broke
