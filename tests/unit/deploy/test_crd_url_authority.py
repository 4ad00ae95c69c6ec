"""Issue 38: the CRD refuses a model URL whose authority hides a second host (``?@``, ``#@``,
``\\@``, user info), as the operator and the fetch do (the chart's copy is byte-identical)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

CRD = Path(__file__).resolve().parents[3] / "crds" / "packratmodel.yaml"


def _model_props() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["spec"]["properties"]["model"]["properties"]
    return props


@pytest.mark.parametrize("field", ["storageUri", "uri"])
@pytest.mark.parametrize(
    "uri",
    [
        "http://attacker.example.net?@models.example.com/m.pt",
        "http://attacker.example.net#@models.example.com/m.pt",
        "http://attacker.example.net\\@models.example.com/m.pt",
        "https://user:pw@models.example.com/m.pt",
    ],
)
def test_the_crd_refuses_a_hiding_authority(field: str, uri: str) -> None:
    pattern = _model_props()[field]["pattern"]
    assert re.search(pattern, uri) is None


@pytest.mark.parametrize(
    ("field", "uri"),
    [
        ("storageUri", "https://models.example.com:8443/a/m.pt?v=1"),
        ("storageUri", "s3://bucket_1/k.pt"),
        ("storageUri", "http://[fd00::1]:9000/m.pt"),
        ("storageUri", "pvc://claim/dir/m.pt"),
        ("uri", "https://models.example.com/m.mar"),
    ],
)
def test_the_crd_keeps_plain_urls(field: str, uri: str) -> None:
    assert re.search(_model_props()[field]["pattern"], uri) is not None
