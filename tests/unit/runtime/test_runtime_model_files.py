"""Model files users have (issue 37 item 5): a plain torch.jit.save file takes declared
inputs, an ONNX file gives its own (or has them checked), external data stays inside the
model's folder, and a model that fails on its inputs is one ZooError line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from packrat.runtime import inputs as decl
from packrat.runtime import zoo
from packrat.runtime.engines import EngineError
from packrat.runtime.engines.onnx_export import export_onnx
from packrat.runtime.engines.onnx_file import external_files, onnx_inputs

onnx = pytest.importorskip("onnx", reason="the onnx package (the onnxruntime extra)")
pytest.importorskip("onnxruntime", reason="the onnxruntime extra")

FEATURES = [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]


@pytest.fixture
def no_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(decl.ENV, "")  # restored after the test


def _onnx(path: Path, *, axes: dict[int, str] | None = None, external: bool = False) -> Path:
    torch.onnx.export(
        zoo.tiny(), (torch.randn(2, 16),), str(path), input_names=["features"],
        output_names=["logits"], dynamic_axes={"features": axes or {0: "b"}, "logits": {0: "b"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    if external:
        graph = onnx.load(str(path))
        onnx.save_model(graph, str(path), save_as_external_data=True, location="w.data",
                        size_threshold=0)  # fmt: skip
    return path


def _relocate(path: Path, location: str) -> None:
    """Point every external tensor of ``path`` at ``location`` (a hostile file)."""
    graph = onnx.load(str(path), load_external_data=False)
    for tensor in graph.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(graph, str(path))


def test_a_plain_torchscript_file_takes_declared_inputs(
    tmp_path: Path, no_declaration: None
) -> None:
    path = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(zoo.tiny()), str(path))  # type: ignore[no-untyped-call]
    with pytest.raises(zoo.ZooError, match="does not describe its inputs; declare them"):
        zoo.input_spec(str(path))
    decl.declare(decl.parse_inputs(FEATURES))
    assert zoo.check_model(str(path)) == [
        {"shape": [16], "dtype": "float32", "high": 0, "name": "features"}
    ]
    decl.declare(decl.parse_inputs([{"name": "x", "datatype": "FP32", "shape": [-1, 17]}]))
    with pytest.raises(zoo.ZooError, match=r"float32\[-1, 17\]\) fails: RuntimeError") as info:
        zoo.check_model(str(path))
    assert "\n" not in str(info.value)


def test_an_onnx_file_gives_its_inputs_and_runs_like_the_model(
    tmp_path: Path, no_declaration: None
) -> None:
    path = _onnx(tmp_path / "tiny.onnx", external=True)
    assert zoo.input_spec(str(path)) == [
        {"shape": [16], "dtype": "float32", "high": 0, "name": "features"}
    ]
    x = zoo.example_input(str(path), 3)
    assert isinstance(x, torch.Tensor)
    got = zoo.load_model(str(path))(x)
    torch.testing.assert_close(got, zoo.tiny()(x), rtol=1e-4, atol=1e-5)
    # the engines start from the file itself, its external data copied beside it
    out = tmp_path / "artefact"
    out.mkdir()
    copied = export_onnx(zoo.load_model(str(path)), [], out / "model.onnx")
    assert copied == out / "model.onnx" and (out / "w.data").is_file()


def test_declared_inputs_are_checked_against_the_onnx_graph(
    tmp_path: Path, no_declaration: None
) -> None:
    path = _onnx(tmp_path / "sym.onnx", axes={0: "b", 1: "width"})
    with pytest.raises(decl.InputsError, match="symbolic dimensions"):
        onnx_inputs(path, None)
    assert onnx_inputs(path, decl.parse_inputs(FEATURES))[0]["shape"] == [16]
    for bad, says in (
        ([{"name": "other", "datatype": "FP32", "shape": [-1, 16]}], "graph's inputs are"),
        ([{"name": "features", "datatype": "INT64", "shape": [-1, 16]}], "declared int64"),
        ([{"name": "features", "datatype": "FP32", "shape": [-1, 16, 2]}], "declared float32"),
    ):
        with pytest.raises(decl.InputsError, match=says):
            onnx_inputs(path, decl.parse_inputs(bad))


def test_a_fixed_batch_or_a_corrupt_file_is_refused(tmp_path: Path, no_declaration: None) -> None:
    fixed = _onnx(tmp_path / "fixed.onnx", axes={1: "w"})  # the batch fixed at 2
    with pytest.raises(zoo.ZooError, match="dynamic first"):
        zoo.input_spec(str(fixed))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(zoo.ZooError, match="not an ONNX model"):
        zoo.input_spec(str(junk))


@pytest.mark.parametrize(
    "location", ["/etc/passwd", "../outside.data", "sub/../../outside.data", "link.data"]
)
def test_external_data_never_leaves_the_models_folder(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _onnx(folder / "tiny.onnx", external=True)
    shutil.copyfile(folder / "w.data", tmp_path / "outside.data")
    os.symlink(tmp_path / "outside.data", folder / "link.data")
    assert external_files(path) == [(folder / "w.data").resolve()]
    _relocate(path, location)
    with pytest.raises(EngineError, match="must be a file inside"):
        external_files(path)
