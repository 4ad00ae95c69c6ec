"""The torch-free model facts agree with the zoo, and importing them imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from packrat.runtime import modelid, weights, zoo
from packrat.serve.codec import decode_sample, warmup_body
from packrat.serve.zygote.shared_weights import shared_weights_file


@pytest.mark.parametrize("name", zoo.ZOO_NAMES)
def test_the_zoo_and_modelid_describe_each_model_alike(name: str) -> None:
    assert modelid.zoo_input_spec(name) == zoo.input_spec(name)
    assert modelid.model_digest(name) == zoo.model_digest(name)
    assert modelid.model_name(name.upper()) == zoo.model_name(name) == name


def test_a_file_is_left_to_the_zoo(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(b"not a model")
    assert modelid.zoo_key(str(path)) is None
    assert modelid.zoo_input_spec(str(path)) is None
    assert modelid.model_digest(str(path)) is None
    assert modelid.file_digest(path) == zoo.model_digest(str(path))


@pytest.mark.parametrize("spec", ["resnet50", "zoo:bert", "FILE"])
def test_the_pods_weight_file_name_is_the_runtimes(tmp_path: Path, spec: str) -> None:
    if spec == "FILE":
        spec = str(tmp_path / "user-model.pt")
        Path(spec).write_bytes(b"some bytes")
    assert shared_weights_file(spec, tmp_path) == weights.weights_path(tmp_path / "weights", spec)


@pytest.mark.parametrize("name", zoo.ZOO_NAMES)
def test_the_warm_up_body_is_one_valid_sample(name: str) -> None:
    inputs = zoo.input_spec(name)
    body = warmup_body(inputs)
    assert body is not None and body == warmup_body(inputs)  # deterministic
    tensors = decode_sample(body, inputs)
    for tensor, item in zip(tensors, inputs, strict=True):
        assert list(tensor.shape) == item["shape"]
        if item["high"]:
            assert int(tensor.min()) >= 0 and int(tensor.max()) < item["high"]
        else:
            assert torch.all(tensor.abs() <= 1.0)


def test_a_dtype_array_cannot_write_has_no_warm_up_body() -> None:
    assert warmup_body([{"shape": [4], "dtype": "bfloat16"}]) is None


def test_the_dispatchers_model_facts_import_no_torch() -> None:
    code = (
        "import sys, tempfile, pathlib\n"
        "from packrat.serve.pod import server\n"
        "from packrat.serve.zygote.shared_weights import shared_weights_file\n"
        "from packrat.serve.codec import warmup_body\n"
        "from packrat.runtime import modelid\n"
        "shared_weights_file('resnet50', pathlib.Path(tempfile.gettempdir()))\n"
        "warmup_body(modelid.zoo_input_spec('resnet50'))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
