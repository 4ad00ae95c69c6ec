"""A user's ONNX file: its inputs read from the graph, checked as hostile input, and run.

An ONNX file has no eager PyTorch form: :class:`OnnxModule` runs it on ONNX Runtime behind
the ``nn.Module`` interface the profiler and the native runtime call, so ONNX Runtime is its
reference (what the ``eager`` engine measures and what other engines are checked against),
and the ONNX Runtime and OpenVINO engines start from the file itself
(:func:`packrat.runtime.engines.onnx_export.export_onnx` copies it).

The file is hostile input: it is at most :data:`MAX_GRAPH_BYTES` (protobuf's own limit), its
external-data files must be regular files inside the model's folder (no absolute path, no
``..``, no symlink out) and at most :data:`MAX_EXTERNAL_BYTES` together; the graph is parsed
without loading external data.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from packrat.runtime.engines.base import EngineError, EngineMissingError
from packrat.runtime.inputs import InputsError

if TYPE_CHECKING:
    from packrat.runtime.engines.ort import OrtRunner

__all__ = ["MAX_GRAPH_BYTES", "OnnxModule", "copy_model", "external_files", "onnx_inputs"]

MAX_GRAPH_BYTES = 2 << 30
MAX_EXTERNAL_BYTES = 64 << 30
_ONNX_DTYPES = {1: "float32", 11: "float64", 2: "uint8", 3: "int8", 5: "int16", 6: "int32"}
_ONNX_DTYPES |= {7: "int64", 9: "bool"}


def _load_graph(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise EngineMissingError(
            "an ONNX model needs the onnx package (pip install 'packrat-operator[onnxruntime]')"
        ) from None
    size = path.stat().st_size
    if size > MAX_GRAPH_BYTES:
        raise EngineError(f"{path}: {size} bytes, an ONNX graph is at most {MAX_GRAPH_BYTES}")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # a corrupt file: one line
        raise EngineError(f"{path}: not an ONNX model: {type(exc).__name__}: {exc}"[:300]) from None


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor of ``graph`` and its subgraphs that may keep its data outside the file."""
    yield from graph.initializer
    yield from (s.values for s in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def external_files(path: Path, model: Any = None) -> list[Path]:
    """The external-data files ``path`` names, each checked to stay inside its folder."""
    model = _load_graph(path) if model is None else model
    folder = path.parent.resolve()
    found: dict[Path, None] = {}
    total = 0
    for tensor in _tensors(model.graph):
        if tensor.data_location != 1:  # TensorProto.EXTERNAL
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (folder / location).resolve()
        if (
            not location
            or os.path.isabs(location)
            or ".." in Path(location).parts
            or not target.is_relative_to(folder)
            or not target.is_file()
        ):
            raise EngineError(
                f"{path}: external data {location!r} must be a file inside {folder}"[:300]
            )
        if target not in found:
            found[target] = None
            total += target.stat().st_size
    if total > MAX_EXTERNAL_BYTES:
        raise EngineError(f"{path}: external data of {total} bytes (at most {MAX_EXTERNAL_BYTES})")
    return list(found)


def _graph_inputs(path: Path, model: Any) -> list[dict[str, Any]]:
    """The graph's inputs (initializers excluded): name, torch dtype, shape (None: symbolic)."""
    constants = {t.name for t in model.graph.initializer}
    out = []
    for value in model.graph.input:
        if value.name in constants:
            continue
        kind = value.type.tensor_type
        dtype = _ONNX_DTYPES.get(kind.elem_type)
        if dtype is None:
            raise EngineError(
                f"{path}: input {value.name} has ONNX type {kind.elem_type}, not served"
            )
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim]
        if not dims or (dims[0] is not None and dims[0] > 0):
            raise EngineError(
                f"{path}: input {value.name} has shape {dims}: export it with a dynamic first "
                "(batch) dimension"
            )
        shape = [d if d is not None and d > 0 else None for d in dims[1:]]
        out.append({"name": value.name, "dtype": dtype, "shape": shape})
    return out


def onnx_inputs(path: Path, declared: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The file's inputs (no batch dimension), in the graph's order: from the graph, or the
    ``declared`` ones checked against it (names, dtypes, rank and every fixed dimension)."""
    model = _load_graph(path)
    external_files(path, model)
    graph = _graph_inputs(path, model)
    if declared is None:
        for item in graph:
            if None in item["shape"]:
                raise InputsError(
                    f"{path}: input {item['name']} has symbolic dimensions {item['shape']}: "
                    "declare the inputs (packrat --inputs, spec.model.inputs)"
                )
        return [{**item, "high": 0} for item in graph]
    by_name = {str(d["name"]): d for d in declared}
    if sorted(by_name) != sorted(i["name"] for i in graph):
        raise InputsError(
            f"{path}: the graph's inputs are {[i['name'] for i in graph]}, declared {list(by_name)}"
        )
    out = []
    for item in graph:
        decl = by_name[item["name"]]
        shape = list(decl["shape"])
        fits = len(shape) == len(item["shape"]) and all(
            g is None or g == d for g, d in zip(item["shape"], shape, strict=True)
        )
        if decl["dtype"] != item["dtype"] or not fits:
            raise InputsError(
                f"{path}: input {item['name']} is {item['dtype']} {item['shape']} in the graph, "
                f"declared {decl['dtype']} {shape}"
            )
        out.append(
            {"name": item["name"], "dtype": item["dtype"], "shape": shape, "high": decl["high"]}
        )
    return out


def copy_model(path: Path, target: Path) -> Path:
    """Copy the ONNX file to ``target`` and its (checked) external data beside it, same
    layout."""
    source_folder = path.parent.resolve()
    for data in external_files(path):
        dest = target.parent / data.relative_to(source_folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data, dest)
    shutil.copyfile(path, target)
    return target


class OnnxModule(nn.Module):
    """An ONNX file as a module: ONNX Runtime with this process's torch thread count, its
    session made at the first batch of each process (its thread pool does not survive a fork,
    and the profiler's and the runtime's workers are forked after the model is built)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.onnx_path = path
        self._runner: OrtRunner | None = None
        self._pid = -1

    def forward(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
        if self._runner is None or self._pid != os.getpid():
            from packrat.runtime.engines.ort import OnnxRuntime

            engine = OnnxRuntime()
            reason = engine.missing()
            if reason is not None:
                raise EngineMissingError(reason)
            self._runner = engine.load(self.onnx_path, model=None, threads=torch.get_num_threads())
            self._pid = os.getpid()
        return self._runner.run(inputs)
