"""The CRD's CEL rules (``x-kubernetes-validations``), evaluated for real with cel-python.

A real API server applies the schema's defaults and then evaluates every rule with ``self``
bound to the value at the rule's place in the object (every element, under an array). These
tests do the same, walking ``crds/packratmodel.yaml`` to find the rules: each rule compiles,
the shipped examples and the boundary cases pass every rule, and each rule has an invalid
example that fails that rule and no other. A rule added to the CRD without cases here fails
``test_every_rule_has_cases``.

Kubernetes adds its own CEL libraries (quantities, regex, URLs); the rules here use only
standard CEL (``has``, ``size``, ``contains``, ``all``, ``filter``), which cel-python covers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
import pytest
from packaging_support import EXAMPLES_DIR, crd_schema, load_yaml_docs

SCHEMA = crd_schema()
ITEMS = "[]"  # a path step into every element of an array
VALUES = "{}"  # a path step into every value of a map (additionalProperties)


@dataclass(frozen=True)
class Rule:
    path: tuple[str, ...]
    rule: str
    message: str

    @property
    def where(self) -> str:
        return ".".join(self.path) or "<root>"


def rules_of(schema: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[Rule]:
    """Every CEL rule in the schema, with the path of the value it validates."""
    for item in schema.get("x-kubernetes-validations") or []:
        yield Rule(path, item["rule"], item.get("message", item["rule"]))
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules_of(sub, (*path, name))
    if isinstance(schema.get("items"), Mapping):
        yield from rules_of(schema["items"], (*path, ITEMS))
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from rules_of(schema["additionalProperties"], (*path, VALUES))


RULES = list(rules_of(SCHEMA))


def with_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with the schema's defaults applied, as the API server does before validating
    (a defaulted object gets its own properties' defaults too)."""
    if isinstance(value, dict):
        out = dict(value)
        for name, sub in (schema.get("properties") or {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(sub, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            known = set(schema.get("properties") or {})
            for name, item in list(out.items()):
                if name not in known:
                    out[name] = with_defaults(extra, item)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [with_defaults(schema["items"], v) for v in value]
    return value


def selves(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    """The values a rule at ``path`` sees as ``self`` (none where the path is absent)."""
    if not path:
        yield value
        return
    step, rest = path[0], path[1:]
    if step == ITEMS:
        for item in value if isinstance(value, list) else []:
            yield from selves(item, rest)
    elif step == VALUES:
        for item in (value if isinstance(value, dict) else {}).values():
            yield from selves(item, rest)
    elif isinstance(value, dict) and step in value:
        yield from selves(value[step], rest)


_ENV = celpy.Environment()
_PROGRAMS = {r.rule: _ENV.program(_ENV.compile(r.rule)) for r in RULES}


def holds(rule: Rule, value: Any) -> bool:
    result = _PROGRAMS[rule.rule].evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, Exception):  # cel-python returns evaluation errors as values
        raise AssertionError(f"{rule.where}: {rule.rule!r} raised {result!r}")
    return bool(result)


def violations(obj: Mapping[str, Any]) -> list[str]:
    """The messages of every rule the object breaks, after defaulting."""
    defaulted = with_defaults(SCHEMA, dict(obj))
    return [r.message for r in RULES for v in selves(defaulted, r.path) if not holds(r, v)]


def model(spec: Mapping[str, Any], *, name: str = "m") -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
URI = "https://models.example/m.mar"
PVC = {"persistentVolumeClaim": {"claimName": "models"}, "path": "m.mar"}
CM = {"configMap": {"name": "models"}, "path": "m.mar"}
SLO = {"latencyP99Ms": 100, "rate": 20}
TRACE = {"configMap": "traces", "key": "sample.csv"}
S3 = "s3://bucket/models/m.mar"
DIGEST = "sha256:" + "0" * 64


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = {**BASE, **changes}
    return {k: v for k, v in spec.items() if v is not None}


# rule -> (valid objects at its boundaries, invalid objects that break this rule only)
TUNER_REF = {
    "replicas": 1,
    "capacityPerReplica": 10.0,
    "windowsSeconds": [0.1, 1.0],
    "ratesPerSecond": [1.0, 2.0],
}
CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "self.metadata.name.size() <= 40": (
        [model(BASE, name="a" * 40)],
        [model(BASE, name="a" * 41)],
    ),
    "has(self.slo) || has(self.batchSize) != has(self.autoBatch)": (
        [
            model(spec_with(batchSize=None, autoBatch={"min": 1, "max": 4})),
            model(spec_with(batchSize=None, slo=SLO)),  # the planner chooses the batch
        ],
        [
            model(spec_with(autoBatch={"min": 1, "max": 4})),
            model(spec_with(batchSize=None)),
        ],
    ),
    "!has(self.batchSize) || self.batchSize <= self.profiling.maxBatch": (
        [
            model(spec_with(batchSize=32)),  # the default maxBatch, 32
            model(spec_with(batchSize=64, profiling={"maxBatch": 64})),
        ],
        [
            model(spec_with(batchSize=33)),
            model(spec_with(batchSize=8, profiling={"maxBatch": 4})),
        ],
    ),
    "!has(self.autoBatch) || self.autoBatch.max <= self.profiling.maxBatch": (
        [
            model(spec_with(batchSize=None, autoBatch={})),  # both defaults: 32 <= 32
            model(spec_with(batchSize=None, autoBatch={"max": 64}, profiling={"maxBatch": 64})),
        ],
        [
            model(spec_with(batchSize=None, autoBatch={"max": 64})),
            model(spec_with(batchSize=None, autoBatch={}, profiling={"maxBatch": 16})),
        ],
    ),
    "!has(self.artefactsClaim) || (has(self.engines) && self.engines != ['eager'])": (
        [model(spec_with(engines=["onnxruntime"], artefactsClaim="art")), model(BASE)],
        [
            model(spec_with(artefactsClaim="art")),
            model(spec_with(engines=["eager"], artefactsClaim="art")),
        ],
    ),
    "!self.exists(e, e == 'all') || size(self) == 1": (
        [model(spec_with(engines=["all"])), model(spec_with(engines=["eager", "openvino"]))],
        [model(spec_with(engines=["all", "eager"]))],
    ),
    "!has(self.profiling.threads) || self.profiling.threads.all(t, t <= self.cpus)": (
        [model(spec_with(profiling={"threads": [1, 2]})), model(spec_with(profiling={}))],
        [model(spec_with(profiling={"threads": [1, 3]}))],
    ),
    "[has(self.zoo), has(self.uri), has(self.volume), has(self.storageUri)]"
    ".filter(x, x).size() == 1": (
        [
            model(spec_with(model={"uri": URI, "format": "mar"})),
            model(spec_with(model={"volume": PVC, "format": "torchscript"})),
            model(spec_with(model={"storageUri": S3, "format": "mar"})),
        ],
        [
            model(spec_with(model={"uri": URI, "volume": PVC, "format": "mar"})),
            model(spec_with(model={"storageUri": S3, "uri": URI, "format": "mar"})),
            model(spec_with(model={"format": "mar"})),
        ],
    ),
    "has(self.storageUri) || (!has(self.credentialsSecret) && !has(self.digest))": (
        [
            model(
                spec_with(
                    model={
                        "storageUri": S3,
                        "format": "mar",
                        "credentialsSecret": {"name": "c"},
                        "digest": DIGEST,
                    }
                )
            )
        ],
        [
            model(spec_with(model={"uri": URI, "format": "mar", "digest": DIGEST})),
            model(spec_with(model={"zoo": "tiny", "credentialsSecret": {"name": "c"}})),
        ],
    ),
    "!has(self.storageUri) || !self.storageUri.startsWith('pvc://') "
    "|| !has(self.credentialsSecret)": (
        [model(spec_with(model={"storageUri": "pvc://claim/m.pt", "format": "torchscript"}))],
        [
            model(
                spec_with(
                    model={
                        "storageUri": "pvc://claim/m.pt",
                        "format": "torchscript",
                        "credentialsSecret": {"name": "c"},
                    }
                )
            )
        ],
    ),
    "!has(self.labels) || self.labels.all(k, !k.startsWith('packrat.dev/') "
    "&& !k.startsWith('app.kubernetes.io/'))": (
        [model(spec_with(pod={"labels": {"team": "a"}}))],
        [
            model(spec_with(pod={"labels": {"packrat.dev/slot": "a"}})),
            model(spec_with(pod={"labels": {"app.kubernetes.io/name": "x"}})),
        ],
    ),
    "!has(self.annotations) || self.annotations.all(k, !k.startsWith('packrat.dev/') "
    "&& !k.startsWith('app.kubernetes.io/'))": (
        [model(spec_with(pod={"annotations": {"sidecar.istio.io/inject": "false"}}))],
        [model(spec_with(pod={"annotations": {"packrat.dev/plan": "x"}}))],
    ),
    "!has(self.env) || self.env.all(e, !e.name.startsWith('PACKRAT_') && !(e.name in "
    "['HOME', 'TMPDIR', 'PYTHONUNBUFFERED', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS', "
    "'KMP_AFFINITY', 'GOMP_CPU_AFFINITY']))": (
        [model(spec_with(pod={"env": [{"name": "HTTPS_PROXY", "value": "p"}]}))],
        [
            model(spec_with(pod={"env": [{"name": "PACKRAT_PLAN", "value": "{}"}]})),
            model(spec_with(pod={"env": [{"name": "OMP_NUM_THREADS", "value": "8"}]})),
        ],
    ),
    "has(self.value) != has(self.valueFrom)": (
        [
            model(
                spec_with(
                    pod={"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}
                )
            )
        ],
        [model(spec_with(pod={"env": [{"name": "A"}]}))],
    ),
    "has(self.zoo) || has(self.format)": (
        [model(spec_with(model={"zoo": "resnet50", "name": "r"}))],
        [model(spec_with(model={"uri": URI})), model(spec_with(model={"volume": CM}))],
    ),
    "!has(self.zoo) || !has(self.format)": (
        [model(spec_with(model={"uri": URI, "format": "torchscript"}))],
        [model(spec_with(model={"zoo": "tiny", "format": "mar"}))],
    ),
    "has(self.persistentVolumeClaim) != has(self.configMap)": (
        [model(spec_with(model={"volume": CM, "format": "mar"}))],
        [
            model(spec_with(model={"volume": {**PVC, **CM}, "format": "mar"})),
            model(spec_with(model={"volume": {"path": "m.mar"}, "format": "mar"})),
        ],
    ),
    "!self.contains('..')": (
        [model(spec_with(model={"volume": {**PVC, "path": "a/b.c/.d"}, "format": "mar"}))],
        [
            model(spec_with(model={"volume": {**PVC, "path": "a/../b"}, "format": "mar"})),
            model(spec_with(model={"volume": {**PVC, "path": "m..mar"}, "format": "mar"})),
        ],
    ),
    "!has(self.slo) || !has(self.batchSize)": (
        [
            model(spec_with(batchSize=None, slo=SLO, autoscaling={"maxReplicas": 4})),
            # the plan inside a replica follows the load while the tuner sets replicas
            model(spec_with(batchSize=None, slo=SLO, autoBatch={"min": 1, "max": 4})),
        ],
        [model(spec_with(slo=SLO))],
    ),
    "!has(self.autoscaling) || self.autoscaling.mode != 'envelope' || has(self.slo) "
    "|| has(self.autoscaling.reference)": (
        [
            model(spec_with(autoscaling={"mode": "external"})),
            model(spec_with(autoscaling={"reference": TUNER_REF})),
        ],
        [model(spec_with(autoscaling={})), model(spec_with(autoscaling={"mode": "envelope"}))],
    ),
    "!has(self.autoscaling) || !has(self.autoscaling.reference) "
    "|| (!has(self.slo) && self.autoscaling.mode == 'envelope')": (
        [model(spec_with(autoscaling={"mode": "envelope", "reference": TUNER_REF}))],
        [
            model(spec_with(autoscaling={"mode": "external", "reference": TUNER_REF})),
            model(spec_with(batchSize=None, slo=SLO, autoscaling={"reference": TUNER_REF})),
        ],
    ),
    "!has(self.reference) || "
    "self.reference.windowsSeconds.size() == self.reference.ratesPerSecond.size()": (
        [model(spec_with(autoscaling={"reference": TUNER_REF}))],
        [model(spec_with(autoscaling={"reference": {**TUNER_REF, "ratesPerSecond": [1.0]}}))],
    ),
    "has(self.trace) != has(self.rate)": (
        [model(spec_with(batchSize=None, slo={"latencyP99Ms": 9, "trace": TRACE}))],
        [
            model(spec_with(batchSize=None, slo={"latencyP99Ms": 9})),
            model(spec_with(batchSize=None, slo={**SLO, "trace": TRACE})),
        ],
    ),
    "self.minReplicas <= self.maxReplicas": (
        [model(spec_with(autoscaling={"mode": "external", "minReplicas": 3, "maxReplicas": 3}))],
        [
            model(spec_with(autoscaling={"mode": "external", "minReplicas": 4, "maxReplicas": 3})),
            model(spec_with(autoscaling={"mode": "external", "minReplicas": 11})),  # default 10
        ],
    ),
    "self.min <= self.max": (
        [model(spec_with(batchSize=None, autoBatch={"min": 4, "max": 4}))],
        [
            model(spec_with(batchSize=None, autoBatch={"min": 8, "max": 4})),
            model(spec_with(batchSize=None, autoBatch={"min": 33})),  # over the default max
        ],
    ),
}


def test_the_walk_finds_rules_at_every_level() -> None:
    paths = {r.path for r in RULES}
    assert () in paths and ("spec",) in paths
    assert ("spec", "model", "volume", "path") in paths  # a rule on a string, four levels down


def test_every_rule_has_cases() -> None:
    assert sorted(r.rule for r in RULES) == sorted(CASES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.where}:{r.rule}")
def test_rule_compiles_and_has_a_message(rule: Rule) -> None:
    assert rule.rule in _PROGRAMS
    assert rule.message and rule.message != rule.rule


@pytest.mark.parametrize("rule", sorted(CASES))
def test_valid_cases_pass_every_rule(rule: str) -> None:
    valid, _ = CASES[rule]
    for obj in valid:
        assert violations(obj) == [], obj["spec"]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_invalid_cases_break_that_rule_only(rule: str) -> None:
    (message,) = {r.message for r in RULES if r.rule == rule}
    _, invalid = CASES[rule]
    assert invalid
    for obj in invalid:
        assert violations(obj) == [message], obj


def test_examples_pass_every_rule() -> None:
    models = [
        doc
        for path in sorted(EXAMPLES_DIR.glob("*.yaml"))
        for doc in load_yaml_docs(path)
        if doc.get("kind") == "PackratModel"
    ]
    assert models
    for obj in models:
        assert violations(obj) == [], obj["metadata"]["name"]


def test_defaults_are_applied_before_the_rules() -> None:
    # batchSize 33 is valid only against an explicit maxBatch: the default (32) is in force
    assert violations(model(spec_with(batchSize=33, profiling={"maxBatch": 64}))) == []
    defaulted = with_defaults(SCHEMA, model(BASE))
    assert defaulted["spec"]["profiling"]["maxBatch"] == 32
    assert defaulted["spec"]["replicas"] == 1


def test_an_array_rule_sees_every_element() -> None:
    schema = {
        "type": "object",
        "properties": {
            "xs": {
                "type": "array",
                "items": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]},
            }
        },
    }
    (rule,) = rules_of(schema)
    assert rule.path == ("xs", ITEMS)
    _PROGRAMS.setdefault(rule.rule, _ENV.program(_ENV.compile(rule.rule)))
    assert [holds(rule, v) for v in selves({"xs": [1, 0, 2]}, rule.path)] == [True, False, True]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_the_operators_reading_of_each_rule_agrees_with_cel(rule: str) -> None:
    # packrat.controller.api.cel reads each rule in Python (the operator has no CEL): on every
    # case, valid or not, each rule's reading gives cel-python's verdict
    from packrat.controller.api.cel import READINGS

    valid, invalid = CASES[rule]
    for obj in [*valid, *invalid]:
        defaulted = with_defaults(SCHEMA, obj)
        for r in RULES:
            for value in selves(defaulted, r.path):
                assert READINGS[r.rule](value) == holds(r, value), (r.rule, obj["spec"])
