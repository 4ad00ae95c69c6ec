"""An artefact's manifest names its file inside the artefact's folder, never outside it
(issue 38, the new surfaces): a manifest written into the shared cache with ``"file":
"/..."`` or ``"../..."`` made every pod of the model load whatever that path held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat.runtime.engines import engine, input_specs
from packrat.runtime.engines.base import EngineError
from packrat.runtime.engines.cache import FORMAT, MANIFEST, artefact_folder, find
from packrat.runtime.zoo import model_digest, model_name

pytest.importorskip("onnxruntime", reason="the ort engine's version names the folder")


@pytest.mark.parametrize("kind", ["absolute", "parent", "nested", "plain"])
def test_a_manifest_names_a_file_in_its_own_folder(tmp_path: Path, kind: str) -> None:
    ort = engine("onnxruntime")
    folder = artefact_folder(
        tmp_path / "cache", model=model_name("tiny"), digest=model_digest("tiny"),
        engine=ort.name, version=ort.version(), inputs=input_specs("tiny"),
    )  # fmt: skip
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.onnx"
    elsewhere.write_bytes(b"not the converted model")
    (folder / "sub").mkdir()
    (folder / "sub" / "model.onnx").write_bytes(b"x")
    (folder / "model.onnx").write_bytes(b"x")
    name = {
        "absolute": str(elsewhere),
        "parent": "../../../elsewhere.onnx",
        "nested": "sub/model.onnx",
        "plain": "model.onnx",
    }[kind]
    manifest = {"format": FORMAT, "model_digest": model_digest("tiny"), "file": name}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    if kind == "plain":
        assert find(tmp_path / "cache", "tiny", ort).path == folder / "model.onnx"
        return
    with pytest.raises(EngineError, match="no onnxruntime"):
        find(tmp_path / "cache", "tiny", ort)
