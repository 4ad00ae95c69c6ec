"""The examples users `kubectl apply` first, validated offline: each PackratModel against the
CRD's openAPIV3Schema (structure, types, bounds, enums, unknown fields) and against the
operator's own spec validation (the CEL cross-field rules), other objects against the
Kubernetes schemas.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from openapi_schema_validator import OAS30Validator
from packaging_support import EXAMPLES_DIR, crd_schema, load_yaml_docs

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected, as a structural schema does (the API server
    prunes or, with strict field validation, rejects them), except where it preserves them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _validator() -> OAS30Validator:
    schema = _strict(crd_schema())
    schema["properties"]["metadata"] = {"type": "object"}
    return OAS30Validator(schema)


def _models() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in EXAMPLES
        for doc in load_yaml_docs(path)
        if doc.get("kind") == "PackratModel"
    ]


def test_examples_cover_the_documented_cases() -> None:
    models = dict(_models())
    specs = [m["spec"] for m in models.values()]
    assert any(s["model"].get("zoo") == "resnet50" and "batchSize" in s for s in specs)
    assert any("volume" in s["model"] and s["model"].get("format") == "mar" for s in specs)
    assert any("uri" in s["model"] and s["model"].get("format") == "mar" for s in specs)
    assert any("autoBatch" in s for s in specs)
    assert (EXAMPLES_DIR / "resnet50.yaml").exists()


@pytest.mark.parametrize(("name", "model"), _models(), ids=[n for n, _ in _models()])
def test_example_matches_the_crd_schema(name: str, model: dict[str, Any]) -> None:
    errors = sorted(_validator().iter_errors(model), key=lambda e: list(e.path))
    assert errors == [], f"{name}: {[e.message for e in errors]}"
    assert model["apiVersion"] == "packrat.dev/v1alpha1"
    assert len(model["metadata"]["name"]) <= 40  # CEL rule on metadata.name


@pytest.mark.parametrize(("name", "model"), _models(), ids=[n for n, _ in _models()])
def test_example_passes_the_operator_validation(name: str, model: dict[str, Any]) -> None:
    spec_module = pytest.importorskip("packrat.controller.core.spec")
    errors = spec_module.validate_spec(model["spec"], name=model["metadata"]["name"])
    assert errors == [], f"{name}: {errors}"


@pytest.mark.parametrize(
    "path", [p for p in EXAMPLES if any(d["kind"] != "PackratModel" for d in load_yaml_docs(p))]
)
@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_other_example_objects_are_valid_kubernetes(path: Path, version: str) -> None:
    for doc in load_yaml_docs(path):
        if doc["kind"] != "PackratModel":
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda s: s.update(cpus="4"), "cpus as a string"),
        (lambda s: s.update(cpus=0), "cpus below the minimum"),
        (lambda s: s.update(batchSise=8), "unknown spec field"),
        (lambda s: s["model"].update(zoo="resnet51"), "unknown zoo model"),
        (lambda s: s["profiling"].update(precision=0), "precision must be > 0"),
        (lambda s: s["model"].update(format="savedmodel"), "unknown format"),
    ],
)
def test_schema_check_rejects_broken_models(mutate: Any, why: str) -> None:
    _, model = next(m for m in _models() if m[0] == "resnet50.yaml")
    broken = copy.deepcopy(model)
    mutate(broken["spec"])
    assert list(_validator().iter_errors(broken)), why


_PLAN = {
    "cpus": 1,
    "batch": 1,
    "instances": [{"threads": 1, "batch": 1, "count": 1, "latency_ms": 1.0}],
    "expected_latency_ms": 1.0,
    "fat_latency_ms": 1.0,
    "expected_speedup": 1.0,
    "num_instances": 1,
    "total_threads": 1,
    "label": "1x1t/b1",
    "alternatives": {},
}


@pytest.mark.parametrize(("name", "model"), _models(), ids=[n for n, _ in _models()])
def test_example_objects_the_operator_builds_are_valid_and_guaranteed(
    name: str, model: dict[str, Any]
) -> None:
    """What `kubectl apply -f examples/<name>` leads to: the operator's profiling Job, slot
    Deployment and Service for that spec, valid for Kubernetes and Guaranteed QoS."""
    manifests = pytest.importorskip("packrat.controller.serving.manifests")
    profile_manifests = pytest.importorskip("packrat.controller.profiling.manifests")
    owner = {**copy.deepcopy(model), "metadata": {**model["metadata"], "uid": "uid-1"}}
    owner["metadata"].setdefault("namespace", "models")
    typed = pytest.importorskip("packrat.controller.core.model").parse(owner)
    built = [
        profile_manifests.profiling_job(typed),
        manifests.serving_deployment(typed, slot="a", serving_hash="f" * 16, replicas=1),
        manifests.service(owner, slot="a"),
    ]
    for obj in built:
        for version in ("1.30.0", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)
    for workload in built[:2]:
        spec = workload["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            resources = container["resources"]
            assert resources["requests"] == resources["limits"], f"{name}: {container['name']}"
            cpu = str(resources["limits"]["cpu"])
            assert cpu.isdigit() and int(cpu) == model["spec"]["cpus"], f"{name}: cpu {cpu}"
            # The images expect a read-only root with HOME/TMPDIR on a /tmp emptyDir.
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            if container["name"] != "publish":  # `cat` of the result needs no scratch space
                assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == mounts["/tmp"])
        assert spec["securityContext"]["runAsNonRoot"] is True
