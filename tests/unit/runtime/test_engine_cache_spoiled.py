"""A cached artefact whose bytes are not what the profiling Job wrote is not found.

The manifest records each file's size and SHA-256; a truncated file (a full disk, a copy cut
short) or a swapped one (another model's ONNX of the same shape) is a miss: a serving pod
fails with the one line that says to profile again, and the profiling Job converts again and
replaces the spoiled entry. Before, a pod loaded whatever the folder held (a truncated ONNX
file raised from inside ONNX Runtime; a swapped one served another model's answers) and a
profiling Job failed on the spoiled folder forever ("cannot store the artefact")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from packrat.runtime import zoo
from packrat.runtime.engines import engine, input_specs
from packrat.runtime.engines.base import EngineError
from packrat.runtime.engines.cache import (
    MANIFEST,
    Artefact,
    converted,
    find,
    find_for_archive,
    model_folder,
)
from packrat.runtime.engines.handler import INPUTS_FILE, recorded_inputs
from packrat.runtime.zoo import model_digest, model_name

pytest.importorskip("onnxruntime", reason="the ort engine converts the artefacts here")


def _convert(root: Path, seed: int | None = None) -> Artefact:
    return converted(
        engine("onnxruntime"),
        root=root,
        model_name=model_name("tiny"),
        digest=model_digest("tiny"),
        inputs=input_specs("tiny"),
        build=lambda: zoo.load_model("tiny", seed=seed),
    )


def _answer(artefact: Artefact) -> torch.Tensor:
    runner = engine("onnxruntime").load(artefact.path, model=None, threads=1)
    x = zoo.example_input("tiny", 2)
    assert isinstance(x, torch.Tensor)
    out = runner.run([x])
    return out if isinstance(out, torch.Tensor) else torch.as_tensor(out[0])


def _truncate(artefact: Artefact, _other: Path) -> None:
    assert artefact.path is not None
    data = artefact.path.read_bytes()
    artefact.path.write_bytes(data[: len(data) // 2])


def _swap(artefact: Artefact, other: Path) -> None:
    assert artefact.path is not None
    shutil.copyfile(other, artefact.path)  # the same graph, another model's weights


@pytest.mark.parametrize("spoil", [_truncate, _swap])
def test_a_spoiled_artefact_is_a_miss_and_the_job_replaces_it(
    tmp_path: Path, spoil: object
) -> None:
    root = tmp_path / "cache"
    first = _convert(root)
    assert first.converted_now and first.path is not None
    want = _answer(find(root, "tiny", engine("onnxruntime")))
    other = _convert(tmp_path / "other", seed=99).path
    assert other is not None and other.read_bytes() != first.path.read_bytes()
    spoil(first, other)  # type: ignore[operator]
    with pytest.raises(EngineError, match="no onnxruntime .* profile it"):
        find(root, "tiny", engine("onnxruntime"))
    again = _convert(root)  # the profiling Job: converts again, replaces the spoiled entry
    assert again.converted_now and again.folder == first.folder
    assert torch.equal(_answer(find(root, "tiny", engine("onnxruntime"))), want)
    assert [p.name for p in root.rglob("*spoiled*")] == []  # nothing left aside


def test_an_intact_artefact_is_found_without_converting(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    first = _convert(root)
    assert first.folder is not None and first.path is not None
    manifest = json.loads((first.folder / MANIFEST).read_text())
    assert manifest["files"]["model.onnx"]["bytes"] == first.path.stat().st_size
    assert not _convert(root).converted_now
    assert find(root, "tiny", engine("onnxruntime")).path is not None


@pytest.mark.parametrize(
    "text",
    ['{"inputs": [{"shape": [1e400]}]}', '{"inputs": [[1]]}', "[" * 100_000, '{"inputs": 7}'],
)
def test_a_spoiled_record_of_a_mar_modules_inputs_is_none(tmp_path: Path, text: str) -> None:
    """A serving pod of a ``.mar`` finds its artefacts by the inputs the profile captured;
    a spoiled record is as if none (the one line that says to profile again), not an
    OverflowError or RecursionError in the worker."""
    name, digest = "m", "sha256:" + "0" * 64
    folder = model_folder(tmp_path, name=name, digest=digest)
    folder.mkdir(parents=True)
    (folder / INPUTS_FILE).write_text(text)
    assert recorded_inputs(tmp_path, name=name, digest=digest) is None
    with pytest.raises(EngineError, match="no onnxruntime"):
        find_for_archive(tmp_path, name=name, digest=digest, engine=engine("onnxruntime"))
