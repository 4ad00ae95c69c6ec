"""The PackratModel CRD accepts the documented examples and rejects bad ones (offline, no CEL)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS30Validator
from packaging_support import ROOT, strict_schema

CRD_PATH = ROOT / "crds" / "packratmodel.yaml"


def _crd() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return data


def _validator() -> OAS30Validator:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    strict = strict_schema(schema)
    strict["properties"]["metadata"] = {"type": "object"}
    return OAS30Validator(strict)


def _obj(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "m"},
        "spec": spec,
    }


FULL = {
    "model": {"zoo": "resnet50", "name": "resnet50"},
    "image": "ghcr.io/packrat-operator/serving:0.1.0",
    "cpus": 4,
    "memory": "4Gi",
    "replicas": 1,
    "batchSize": 8,
    "maxBatchDelayMs": 5,
    "profiling": {
        "maxBatch": 32,
        "threads": [1, 2, 4],
        "precision": 0.02,
        "timeBudgetSeconds": 600,
        "timeoutSeconds": 1800,
        "backoffLimit": 2,
    },
    "nodeSelector": {"node.kubernetes.io/instance-type": "c6i.2xlarge"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "packrat", "effect": "NoSchedule"}
    ],
    "affinity": {"nodeAffinity": {}},
    "switch": {"readyTimeoutSeconds": 300, "drainSeconds": 10},
}
EXAMPLES = [
    FULL,
    {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4},
    {
        "model": {"uri": "https://host/m.mar", "format": "mar", "sampleRequest": "aGVsbG8="},
        "cpus": 4,
        "autoBatch": {
            "min": 1,
            "max": 32,
            "sustainObservations": 3,
            "minIntervalSeconds": 60,
            "minGain": 0.05,
        },
    },
    {
        "model": {
            "volume": {"persistentVolumeClaim": {"claimName": "models"}, "path": "resnet.mar"},
            "format": "mar",
        },
        "cpus": 16,
        "batchSize": 32,
    },
]


def test_crd_names_and_shape() -> None:
    crd = _crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "packratmodels.packrat.dev"
    assert spec["names"]["shortNames"] == ["prm"]
    assert spec["names"]["categories"] == ["packrat"]
    assert spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    # the scale subresource: HPA/KEDA write spec.replicas (spec.autoscaling.mode external)
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    printer = version["additionalPrinterColumns"]
    columns = {c["name"]: c["jsonPath"] for c in printer}
    # kubectl get prm: Ready is the condition (as KServe and Seldon show it), the measured
    # speedup is shown only once measured, the reason and message in -o wide
    assert [c["name"] for c in printer if not c.get("priority")] == [
        "Ready",
        "Phase",
        "Replicas",
        "Available",
        "Plan",
        "Measured",
        "URL",
        "Age",
    ]
    assert columns["Replicas"] == ".status.replicas"
    assert columns["Available"] == ".status.readyReplicas"
    assert columns["URL"] == ".status.url"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Plan"] == ".status.plan.label"
    assert columns["Measured"] == ".status.measured.speedup"
    wide = {c["name"]: c["jsonPath"] for c in printer if c.get("priority") == 1}
    assert wide == {
        "PoolPlan": ".status.poolPlan.plan.label",  # a pooled model's plan on its pool
        "Expected": ".status.plan.expectedSpeedup",
        "Reason": '.status.conditions[?(@.type=="Ready")].reason',
        "Message": '.status.conditions[?(@.type=="Ready")].message',
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    progress = status["profiling"]["properties"]["progress"]["properties"]
    assert {"done", "total", "etaSeconds"} <= set(progress)


def _walk(schema: dict[str, Any], path: str) -> list[str]:
    missing = []
    for name, sub in schema.get("properties", {}).items():
        where = f"{path}.{name}"
        if not sub.get("description"):
            missing.append(where)
        missing += _walk(sub, where)
        if "items" in sub:
            missing += _walk(sub["items"], where + "[]")
    return missing


def test_every_field_has_a_description() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema, "") == []


def test_structural_schema_has_no_additional_properties_beside_properties() -> None:
    # Kubernetes rejects a structural schema with both properties and additionalProperties.
    def check(s: Any) -> None:
        if isinstance(s, dict):
            assert not ("properties" in s and "additionalProperties" in s), s
            for v in s.values():
                check(v)
        elif isinstance(s, list):
            for v in s:
                check(v)

    check(_crd()["spec"]["versions"][0]["schema"])


def test_cel_rules_present() -> None:
    text = CRD_PATH.read_text()
    assert "has(self.batchSize) != has(self.autoBatch)" in text
    assert (
        "[has(self.zoo), has(self.uri), has(self.volume), has(self.storageUri)]"
        ".filter(x, x).size() == 1" in text
    )


@pytest.mark.parametrize("spec", EXAMPLES)
def test_examples_validate(spec: dict[str, Any]) -> None:
    _validator().validate(_obj(spec))


def _bad(path: list[str], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(FULL)
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


@pytest.mark.parametrize(
    "spec",
    [
        _bad(["cpus"], 0),
        _bad(["cpus"], 257),
        _bad(["cpus"], "4"),
        _bad(["replicas"], -1),
        _bad(["batchSize"], 2.5),
        _bad(["memory"], "lots"),
        _bad(["surprise"], True),
        _bad(["model", "zoo"], "alexnet"),
        _bad(["model", "format"], "savedmodel"),
        _bad(["model", "uri"], "ftp://host/m.mar"),
        _bad(["profiling", "precision"], 0),
        _bad(["profiling", "threads"], [0]),
        _bad(["profiling", "colour"], "blue"),
        _bad(["switch", "drainSeconds"], 9999),
        _bad(["tolerations"], [{"operator": "Sometimes"}]),
        {"cpus": 4, "batchSize": 8},
    ],
)
def test_bad_specs_rejected(spec: dict[str, Any]) -> None:
    assert not _validator().is_valid(_obj(spec))
