"""A layer file whose header lies (a corrupted store, a hostile writer) is a LayerFileError
naming the file and what is wrong, before anything is mapped, advised or viewed: before, a
layer at a negative offset had ``evict`` call ``madvise(MADV_DONTNEED)`` on whatever memory
lay below the mapping, a length that was not whole pages overran ``mincore``'s vector by a
byte, tensors outside their layer or over each other were served as weights, and a dtype
that is not one, a shape that is not one, an ``Infinity`` or a deeply nested header raised
TypeError, OverflowError or RecursionError from deep inside torch or json."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from packrat.runtime import layerfile, zoo
from packrat.runtime.layerfile import LayerFile, LayerFileError

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lf") / "tiny.layers"
    model = zoo.load_model("tiny")
    example = zoo.example_input("tiny", 1)
    return layerfile.write_layer_file(model, path, spec="tiny", example=example, min_layer_bytes=0)


def _rewrite(src: Path, dst: Path, change: Callable[[Doc], object]) -> Path:
    """``src`` with its header changed by ``change`` (the layers' bytes where they were)."""
    raw = src.read_bytes()
    (length,) = struct.unpack("<Q", raw[8:16])
    doc = json.loads(raw[16 : 16 + length])
    change(doc)
    header = json.dumps(doc).encode()
    assert 16 + len(header) <= min(
        la["offset"] for la in json.loads(raw[16 : 16 + length])["layers"]
    )
    body = bytearray(raw)
    body[: 16 + length] = bytes(16 + length)
    body[: 16 + len(header)] = layerfile.MAGIC + struct.pack("<Q", len(header)) + header
    dst.write_bytes(bytes(body))
    return dst


def _layer(doc: Doc, i: int = 0) -> Doc:
    layer: Doc = doc["layers"][i]
    return layer


def _tensor(doc: Doc, i: int = 0, j: int = 0) -> list[Any]:
    tensor: list[Any] = _layer(doc, i)["tensors"][j]
    return tensor


HOSTILE: dict[str, tuple[Callable[[Doc], object], str]] = {
    "negative offset": (lambda d: _layer(d).update(offset=-4096), "not whole pages"),
    "a layer below the mapping": (
        lambda d: d["layers"].append(
            {"name": "net.4", "offset": -(2 << 20), "length": 2 << 20, "tensors": []}
        ),
        "not whole pages",
    ),
    "offset inside the header": (lambda d: _layer(d).update(offset=0), "not whole pages"),
    "offset not a page": (lambda d: _layer(d).update(offset=_layer(d)["offset"] + 64), "pages"),
    "length not whole pages": (lambda d: _layer(d).update(length=_layer(d)["length"] + 1), "pages"),
    "negative length": (lambda d: _layer(d).update(length=-4096), "not whole pages"),
    "overlapping layers": (
        lambda d: _layer(d, 1).update(offset=_layer(d, 0)["offset"]),
        "not whole pages",
    ),
    "a tensor beyond its layer": (lambda d: _tensor(d).__setitem__(3, 1 << 20), "leaves its layer"),
    "overlapping tensors": (lambda d: _tensor(d, 0, 1).__setitem__(3, 0), "overlaps another"),
    "an unaligned tensor": (lambda d: _tensor(d, 0, 1).__setitem__(3, 4100), "overlaps another"),
    "not a dtype": (lambda d: _tensor(d).__setitem__(1, "Tensor"), "has dtype 'Tensor'"),
    "no such dtype": (lambda d: _tensor(d).__setitem__(1, "float33"), "has dtype"),
    "a negative dimension": (lambda d: _tensor(d).__setitem__(2, [-1, 16]), "has shape"),
    "a string shape": (lambda d: _tensor(d).__setitem__(2, "abc"), "has shape"),
    "absurd dimensions": (lambda d: _tensor(d).__setitem__(2, [1] * 1000), "has shape"),
    "bytes not its shape's": (lambda d: _tensor(d).__setitem__(4, 64), "not its shape's"),
    "a key twice": (lambda d: _tensor(d, 1).__setitem__(0, _tensor(d)[0]), "appears twice"),
    "an infinite offset": (lambda d: _layer(d).update(offset=float("inf")), "malformed"),
    "a tensor as a dict": (lambda d: _layer(d)["tensors"].append({"a": 1}), "malformed"),
    "layers as a number": (lambda d: d.update(layers=7), "malformed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_lying_header_is_a_clear_error_before_anything_is_mapped(
    tiny: Path, tmp_path: Path, case: str
) -> None:
    change, message = HOSTILE[case]
    path = _rewrite(tiny, tmp_path / "bad.layers", change)
    with pytest.raises(LayerFileError, match=message) as err:
        LayerFile(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_deeply_nested_header_is_a_clear_error(tmp_path: Path) -> None:
    header = b"[" * 200_000
    path = tmp_path / "deep.layers"
    path.write_bytes(layerfile.MAGIC + struct.pack("<Q", len(header)) + header)
    with pytest.raises(LayerFileError, match="nested too deeply"):
        LayerFile(path)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_something_else_in_a_layer_files_place_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    """Before, a FIFO blocked the open (and the pool's start) for ever; a folder raised
    IsADirectoryError from the header's read."""
    path = tmp_path / "odd.layers"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(LayerFileError, match="not a regular file"):
        LayerFile(path)


def test_a_header_beyond_its_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.layers"
    path.write_bytes(layerfile.MAGIC + struct.pack("<Q", layerfile.MAX_HEADER + 1))
    with pytest.raises(LayerFileError, match="too large"):
        LayerFile(path)


def test_layers_naming_modules_the_model_lacks_do_not_match(tiny: Path, tmp_path: Path) -> None:
    """Their hooks would go on no module (an AttributeError deep in the pool's build)."""
    path = _rewrite(tiny, tmp_path / "stray.layers", lambda d: _layer(d).update(name="nope"))
    lf = LayerFile(path)
    with pytest.raises(LayerFileError, match="does not match the model: no module 'nope'"):
        layerfile.build_mapped(lambda: zoo.load_model("tiny"), lf)
    lf.close()


def test_a_layer_listed_twice_does_not_match(tiny: Path, tmp_path: Path) -> None:
    """Each layer's hook runs on every pass: a header naming one module in many empty layers
    made every request run that many hooks."""

    def twice(doc: dict[str, Any]) -> None:
        end = doc["layers"][-1]["offset"] + doc["layers"][-1]["length"]
        doc["layers"].append(
            {"name": _layer(doc)["name"], "offset": end, "length": 0, "tensors": []}
        )

    lf = LayerFile(_rewrite(tiny, tmp_path / "twice.layers", twice))
    with pytest.raises(LayerFileError, match="appears twice"):
        layerfile.build_mapped(lambda: zoo.load_model("tiny"), lf)
    lf.close()


def test_the_writers_own_files_still_open_and_compute(tiny: Path) -> None:
    lf = LayerFile(tiny)
    model = layerfile.build_mapped(lambda: zoo.load_model("tiny"), lf)
    x = zoo.example_input("tiny", 2)
    assert isinstance(x, torch.Tensor)
    with torch.inference_mode():
        assert torch.equal(model(x), zoo.load_model("tiny")(x))
    lf.evict_all()
    assert lf.resident_layers() == [0] * len(lf.layers)
    lf.close()
