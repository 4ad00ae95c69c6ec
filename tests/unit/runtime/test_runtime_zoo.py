"""Unit tests for packrat.runtime.zoo: architectures, inputs, TorchScript files, digests.

The big models are built on the meta device (shapes and parameter counts, no memory, no
compute) so the whole file stays fast; the tiny model runs for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from packrat.runtime import zoo

# Reference parameter counts (torchvision / Hugging Face implementations).
PARAMS = {
    "resnet50": 25_557_032,
    "inception_v3": 27_161_264,
    "bert-base": 109_482_240,
    "gpt2": 124_439_808,
}
OUTPUT = {
    "resnet50": (2, 1000),
    "inception_v3": (2, 1000),
    "bert-base": (2, 768),
    "gpt2": (2, 50257),
    "tiny": (2, 4),
}


def test_zoo_names() -> None:
    assert set(zoo.ZOO_NAMES) == {"resnet50", "inception_v3", "bert-base", "gpt2", "tiny"}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_big_model_architecture_on_meta(name: str) -> None:
    with torch.device("meta"):
        model = zoo.load_model(name)
    assert zoo.parameter_count(model) == PARAMS[name]
    assert not model.training
    x = zoo.example_input(name, 2)
    assert isinstance(x, torch.Tensor) and x.shape[0] == 2
    with torch.inference_mode():
        y = model(x.to("meta"))
    assert tuple(y.shape) == OUTPUT[name]


def test_example_inputs_shapes_and_dtypes() -> None:
    image = zoo.example_input("resnet50", 3)
    assert isinstance(image, torch.Tensor) and image.shape == (3, 3, 224, 224)
    image = zoo.example_input("inception_v3", 1)
    assert isinstance(image, torch.Tensor) and image.shape == (1, 3, 299, 299)
    ids = zoo.example_input("bert-base", 2)
    assert isinstance(ids, torch.Tensor)
    assert ids.shape == (2, 128) and ids.dtype == torch.int64
    assert int(ids.max()) < 30522
    gpt = zoo.example_input("gpt2", 1)
    assert isinstance(gpt, torch.Tensor) and int(gpt.max()) < 50257
    with pytest.raises(ValueError, match="batch"):
        zoo.example_input("tiny", 0)


def test_tiny_runs_and_is_deterministic() -> None:
    a, b = zoo.load_model("tiny"), zoo.tiny()
    x = zoo.example_input("tiny", 2)
    assert isinstance(x, torch.Tensor)
    with torch.inference_mode():
        ya, yb = a(x), b(x)
    assert tuple(ya.shape) == OUTPUT["tiny"]
    assert torch.equal(ya, yb)
    again = zoo.example_input("tiny", 2)
    assert isinstance(again, torch.Tensor) and torch.equal(x, again)
    # the seed is local: the global RNG stream is untouched
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    zoo.load_model("tiny")
    assert torch.equal(before, torch.rand(1))


def test_aliases_and_names() -> None:
    assert zoo.is_zoo_name("zoo:ResNet50")
    assert zoo.model_name("bert") == "bert-base"
    assert zoo.model_name("/models/my_net.pt") == "my_net"
    assert not zoo.is_zoo_name("resnet51")


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(zoo.ZooError, match="not a zoo name"):
        zoo.load_model("resnet51")
    with pytest.raises(zoo.ZooError, match="TorchServe"):
        zoo.load_model(str(tmp_path / "m.mar"))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(zoo.ZooError, match="TorchScript"):
        zoo.load_model(str(bad))


def test_torchscript_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "tiny.pt"
    zoo.save_torchscript(zoo.tiny(), path, inputs=[((16,), torch.float32)])
    model = zoo.load_model(str(path))
    x = zoo.example_input(str(path), 3)
    assert isinstance(x, torch.Tensor) and x.shape == (3, 16)
    with torch.inference_mode():
        assert torch.allclose(model(x), zoo.tiny()(x))
    assert zoo.input_spec(str(path)) == [{"shape": [16], "dtype": "float32", "high": 0}]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_without_input_description(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(zoo.tiny()), str(path))
    assert zoo.load_model(str(path)) is not None
    with pytest.raises(zoo.ZooError, match="does not describe its input"):
        zoo.example_input(str(path), 1)


def test_model_digest(tmp_path: Path) -> None:
    assert zoo.model_digest("resnet50") == zoo.model_digest("zoo:resnet50")
    assert zoo.model_digest("resnet50") != zoo.model_digest("gpt2")
    assert zoo.model_digest("tiny").startswith("sha256:")
    path = tmp_path / "t.pt"
    zoo.save_torchscript(zoo.tiny(), path, inputs=[((16,), torch.float32)])
    first = zoo.model_digest(str(path))
    assert first == zoo.model_digest(str(path))
    path.write_bytes(path.read_bytes() + b"\0")
    assert zoo.model_digest(str(path)) != first
