"""The CRDs as ``kubectl`` users read them (issue 37 item 8): the conditions description lists
exactly the types the operator's code sets, ``status.plan`` is typed (``kubectl explain``
shows its fields) and matches what the operator writes, and the URL column has its field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from openapi_schema_validator import OAS30Validator

from packrat.controller.core.plans import to_status
from packrat.controller.core.status import ModelStatus
from packrat.plan.optimizer import Optimizer
from packrat.plan.padding import padded_plan

ROOT = Path(__file__).resolve().parents[3]
CONTROLLER = ROOT / "operator" / "packrat" / "controller"
SET = re.compile(r'\bcond\(\s*"([A-Za-z]+)"|^CONDITION = "([A-Za-z]+)"', re.M)


def _status_schema(name: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["status"]


def _types_set(files: list[Path]) -> set[str]:
    return {a or b for path in files for a, b in SET.findall(path.read_text())}


def _described(name: str) -> str:
    return " ".join(_status_schema(name)["properties"]["conditions"]["description"].split())


def test_model_conditions_are_described_as_set() -> None:
    files = [p for p in CONTROLLER.rglob("*.py") if "pipeline" not in p.parts]
    types = _types_set(files)
    assert len(types) == 12, types  # a new type: describe it in the CRD, then count it here
    text = _described("packratmodel")
    assert f"the operator sets these {len(types)}:" in text
    listed = set(re.findall(r"\b([A-Z][A-Za-z]+) \(", text))  # "Type (what it means)"
    assert listed == types


def test_pipeline_conditions_are_described_as_set() -> None:
    shared = CONTROLLER / "core" / "context.py"  # Pass.report_conflicts: OwnershipConflict
    types = _types_set([*(CONTROLLER / "pipeline").rglob("*.py"), shared])
    assert types == {"Provisioned", "Ready", "OwnershipConflict"}
    text = _described("packratpipeline")
    assert all(t in text for t in types)


def test_status_plan_is_typed_and_matches_what_the_operator_writes() -> None:
    plan_schema = _status_schema("packratmodel")["properties"]["plan"]
    assert not plan_schema.get("x-kubernetes-preserve-unknown-fields")
    fields = set(plan_schema["properties"])
    table = {(1, 1): 5.0, (1, 2): 1.8, (2, 2): 3.0}
    for batch, engine in ((2, "eager"), (3, "eager"), (2, "openvino")):  # exact, padded
        optimizer = Optimizer(table, cpus=2, max_batch=4, engine=engine)
        written = to_status(padded_plan(optimizer, batch))
        # every field the operator writes is in the schema (else the API server prunes it):
        # the engine only for a plan of another engine than eager
        assert set(written) == fields - ({"engine"} if engine == "eager" else set())
        strict = {**plan_schema, "additionalProperties": False}
        strict["properties"]["instances"]["items"]["additionalProperties"] = False
        OAS30Validator(strict).validate(written)


def test_the_url_column_has_its_field() -> None:
    status = ModelStatus({})
    status.set_endpoint("tiny", "ns", 8080)
    assert status["url"] == "http://tiny.ns.svc:8080"
    assert "url" in _status_schema("packratmodel")["properties"]
