"""spec.model.inputs and the pt2/onnx formats (issue 37 item 5): the spec check refuses a bad
declaration with one message per problem (the operator's InvalidSpec condition and event),
the profiling Job and the serving pod get the same ``--inputs``, the file keeps its format's
suffix, and other inputs are another profile."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from packrat.controller.core.model import model_spec, parse
from packrat.controller.core.spec import validate_spec
from packrat.controller.profiling import manifests as pm
from packrat.controller.serving import manifests as sm
from packrat.runtime.inputs import parse_inputs

INPUTS = [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
SPEC: dict[str, Any] = {
    "model": {"uri": "https://models.example/plain.pt", "format": "torchscript", "inputs": INPUTS},
    "cpus": 2,
    "batchSize": 4,
}


def _with(**model: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["model"].update(model)
    return spec


def test_a_declared_torchscript_file_is_a_valid_spec() -> None:
    assert validate_spec(SPEC, name="plain") == []
    volume = {"persistentVolumeClaim": {"claimName": "m"}, "path": "dir/tiny.onnx"}
    onnx = {"volume": volume, "format": "onnx"}
    assert validate_spec({"model": onnx, "cpus": 2, "batchSize": 4}, name="x") == []


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3]}]}, "must start with -1"),
        ({"inputs": [{"name": "x", "datatype": "STRING", "dims": [3]}]}, "not one of"),
        ({"inputs": []}, "non-empty list"),
        ({"format": "mar", "sampleRequest": "eA=="}, "applies to a torchscript, pt2 or onnx"),
        ({"format": "savedmodel"}, "spec.model.format must be one of"),
    ],
)
def test_a_bad_declaration_is_an_invalid_spec(model: dict[str, Any], says: str) -> None:
    errors = validate_spec(_with(**model), name="plain")
    assert any(says in e for e in errors), errors


def test_a_zoo_model_takes_no_inputs() -> None:
    spec = {"model": {"zoo": "tiny", "inputs": INPUTS}, "cpus": 2, "batchSize": 4}
    assert any("applies to a torchscript" in e for e in validate_spec(spec, name="t"))


def test_a_volume_path_matches_its_format() -> None:
    volume = {"persistentVolumeClaim": {"claimName": "m"}, "path": "tiny.pt"}
    spec = {"model": {"volume": volume, "format": "onnx"}, "cpus": 2, "batchSize": 4}
    assert any("must end in .onnx" in e for e in validate_spec(spec, name="t"))


def _owner(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "plain", "namespace": "ns", "uid": "1"},
        "spec": spec,
    }


def _inputs_arg(cmd: list[str]) -> Any:
    return json.loads(cmd[cmd.index("--inputs") + 1])


def test_the_job_and_the_pod_get_the_same_inputs() -> None:
    typed = parse(_owner(SPEC))
    profile = pm.profile_command(typed, output="/profile/p.json")
    serve = sm.serve_command(typed)
    assert _inputs_arg(profile) == _inputs_arg(serve)
    assert parse_inputs(_inputs_arg(serve)) == parse_inputs(INPUTS)
    assert profile[-2:] == ["-o", "/profile/p.json"]
    zoo = parse(_owner({**SPEC, "model": {"zoo": "tiny"}}))
    assert "--inputs" not in sm.serve_command(zoo) + pm.profile_command(zoo, output="/p.json")


@pytest.mark.parametrize(
    ("fmt", "suffix"), [("pt2", ".pt2"), ("onnx", ".onnx"), ("torchscript", ".pt")]
)
def test_a_fetched_file_keeps_its_formats_suffix(fmt: str, suffix: str) -> None:
    spec = _with(format=fmt)
    target, _, _ = sm.model_source(parse(_owner(spec)))
    assert target.endswith(suffix)


def test_other_inputs_are_another_profile() -> None:
    key = model_spec(SPEC, image="img").profile_key
    other = _with(inputs=[{"name": "features", "datatype": "FP32", "shape": [-1, 32]}])
    assert model_spec(other, image="img").profile_key != key
    assert model_spec(copy.deepcopy(SPEC), image="img").profile_key == key
    # Triton's form of the same input (the CRD takes a list: {"input": [...]} is refused)
    triton = _with(inputs=[{"name": "features", "data_type": "TYPE_FP32", "dims": [16]}])
    assert model_spec(triton, image="img").profile_key == key  # the same inputs, another form
