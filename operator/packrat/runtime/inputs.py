"""A model file's inputs as a user declares them, without importing torch.

A plain ``torch.jit.save`` file says nothing about its inputs, and an ONNX graph may leave
dimensions symbolic; the user then declares them the way model servers' configs do:

- the Open Inference Protocol's metadata (KServe): ``{"name": "x", "datatype": "FP32",
  "shape": [-1, 3, 224, 224]}``, the first dimension ``-1``: the batch;
- Triton's ``config.pbtxt`` fields: ``{"name": "x", "data_type": "TYPE_FP32", "dims":
  [3, 224, 224]}``, dims without the batch (Triton's ``max_batch_size > 0`` form);
- or a sample v2 inference request (``{"inputs": [{"name", "datatype", "shape", "data"}]}``):
  each input's shape with its first dimension taken as the batch.

``high`` (optional, integers only) bounds the random token ids the profiler feeds
(values in ``[0, high)``; default 2). Every input is checked and bounded: at most
:data:`MAX_INPUTS` inputs of at most :data:`MAX_DIMS` dimensions and :data:`MAX_ELEMENTS`
elements per sample. A bad declaration is one :class:`InputsError` line.

The CLI's ``--inputs`` and the operator's ``spec.model.inputs`` both parse here; the CLI
passes the parsed inputs to every process it starts (profiling workers, engine checks,
serving workers) in :data:`ENV` (:func:`declare`), which :mod:`packrat.runtime.zoo` reads
for a model file (never for a zoo model).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packrat.runtime.documents import DocumentError, read_capped

__all__ = [
    "ENV",
    "MAX_ELEMENTS",
    "InputsError",
    "declare",
    "declared",
    "encode",
    "parse_inputs",
    "parse_option",
]

ENV = "PACKRAT_MODEL_INPUTS"
MAX_INPUTS = 64
MAX_DIMS = 8
MAX_ELEMENTS = 1 << 26  # per sample and input: 256 MiB of float32
MAX_TEXT = 1 << 20  # a declaration (or sample request) file's bytes
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$")

# OIP v2 datatype -> torch dtype name (the numeric types the v2 codec serves)
V2_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP32": "float32",
    "FP64": "float64",
}
_TORCH_DTYPES = frozenset(V2_DTYPES.values())
_KEYS = frozenset({"name", "datatype", "data_type", "dtype", "shape", "dims", "high", "data"})
_MAX_HIGH = 1 << 31


class InputsError(ValueError):
    """A declaration of inputs that cannot be used: one line, says which input and why."""


def _dtype(item: Mapping[str, Any], where: str) -> str:
    given = [k for k in ("datatype", "data_type", "dtype") if k in item]
    if len(given) != 1:
        raise InputsError(f"{where}: give one of datatype (FP32), data_type (TYPE_FP32), dtype")
    value = item[given[0]]
    if not isinstance(value, str):
        raise InputsError(f"{where}: {given[0]} must be a string, got {value!r}")
    if given[0] == "dtype":
        if value not in _TORCH_DTYPES:
            raise InputsError(f"{where}: dtype {value!r} is not one of {sorted(_TORCH_DTYPES)}")
        return value
    name = value.removeprefix("TYPE_") if given[0] == "data_type" else value
    if name in V2_DTYPES:
        return V2_DTYPES[name]
    raise InputsError(f"{where}: {given[0]} {value!r} is not one of {', '.join(V2_DTYPES)}")


def _dims(values: Any, where: str, key: str) -> list[int]:
    if not isinstance(values, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in values
    ):
        raise InputsError(f"{where}: {key} must be an array of integers, got {values!r}")
    return list(values)


def _shape(item: Mapping[str, Any], where: str, *, request: bool) -> tuple[int, ...]:
    """The sample shape (no batch): ``shape`` starts with the batch, ``dims`` does not."""
    if ("shape" in item) == ("dims" in item):
        raise InputsError(f"{where}: give shape ([-1, ...], with the batch) or dims (without)")
    if "dims" in item:
        sample = _dims(item["dims"], where, "dims")
    else:
        shape = _dims(item["shape"], where, "shape")
        first_ok = (shape and shape[0] >= 1) if request else (shape and shape[0] == -1)
        if not first_ok:
            want = "a batch size" if request else "-1 (the batch)"
            raise InputsError(f"{where}: shape {shape} must start with {want}")
        sample = shape[1:]
    if len(sample) > MAX_DIMS or any(d < 1 for d in sample):
        raise InputsError(
            f"{where}: sample shape {sample} must have at most {MAX_DIMS} dimensions, each >= 1 "
            "(only the batch may vary)"
        )
    if math.prod(sample) > MAX_ELEMENTS:
        raise InputsError(
            f"{where}: {math.prod(sample)} elements per sample (at most {MAX_ELEMENTS})"
        )
    return tuple(sample)


def _one(item: Any, k: int, *, request: bool) -> dict[str, Any]:
    where = f"input {k}"
    if not isinstance(item, Mapping):
        raise InputsError(f"{where} must be an object with name, datatype and shape")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise InputsError(f"{where}: unknown field {unknown[0]!r}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InputsError(f"{where}: name must match {_NAME_RE.pattern}, got {name!r}")
    where = f"input {name}"
    dtype = _dtype(item, where)
    high = item.get("high", 0)
    if isinstance(high, bool) or not isinstance(high, int) or not 0 <= high <= _MAX_HIGH:
        raise InputsError(f"{where}: high must be an integer in [0, 2**31], got {high!r}")
    if high and dtype.startswith("float"):
        raise InputsError(f"{where}: high applies to integer inputs only")
    shape = _shape(item, where, request=request)
    return {"name": name, "shape": list(shape), "dtype": dtype, "high": high}


def parse_inputs(data: Any) -> list[dict[str, Any]]:
    """Declared inputs -> ``[{"name", "shape" (no batch), "dtype" (torch's), "high"}]``.

    ``data``: a list of inputs, ``{"inputs": [...]}`` (a model config or metadata), Triton's
    ``{"input": [...]}``, or a v2 inference request (its inputs carry ``data``)."""
    items = data
    if isinstance(data, Mapping):
        keys = [k for k in ("inputs", "input") if k in data]
        if len(keys) != 1:
            raise InputsError("the inputs must be a list, or an object with 'inputs' or 'input'")
        items = data[keys[0]]
    if not isinstance(items, (list, tuple)) or not items:  # a tuple: the operator's frozen spec
        raise InputsError("the inputs must be a non-empty list")
    if len(items) > MAX_INPUTS:
        raise InputsError(f"{len(items)} inputs: at most {MAX_INPUTS}")
    request = all(isinstance(i, Mapping) and "data" in i for i in items)
    parsed = [_one(item, k, request=request) for k, item in enumerate(items)]
    names = [p["name"] for p in parsed]
    if len(set(names)) != len(names):
        raise InputsError(f"input names must be distinct, got {names}")
    if request:
        _one_batch(items)
    return parsed


def _one_batch(items: Sequence[Mapping[str, Any]]) -> None:
    batches = {i["shape"][0] for i in items if "shape" in i}
    if len(batches) > 1:
        raise InputsError("every input of the sample request must have the same batch size")


def parse_option(text: str) -> list[dict[str, Any]]:
    """``--inputs``: JSON text, or ``@FILE`` holding JSON (a declaration, a model config's
    inputs, or a sample v2 inference request), at most :data:`MAX_TEXT` bytes."""
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            raw = read_capped(path, MAX_TEXT)
        except DocumentError as exc:
            raise InputsError(f"--inputs {text}: {exc}") from None
        source = text
    else:
        raw = text.encode()
        source = "--inputs"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputsError(f"{source}: not JSON: {str(exc)[:120]}") from None
    try:
        return parse_inputs(data)
    except InputsError as exc:
        raise InputsError(f"{source}: {exc}") from None


def encode(inputs: Sequence[Mapping[str, Any]]) -> str:
    """Parsed inputs as compact JSON that :func:`parse_inputs` reads back (Triton's dims)."""
    items = [
        {"name": i["name"], "dims": list(i["shape"]), "dtype": i["dtype"], "high": i["high"]}
        for i in inputs
    ]
    return json.dumps(items, separators=(",", ":"))


def declare(inputs: Sequence[Mapping[str, Any]]) -> None:
    """Give this process and every process it starts the model file's inputs."""
    os.environ[ENV] = encode(inputs)


def declared() -> list[dict[str, Any]] | None:
    """The inputs :func:`declare` gave (checked again: the variable is this process's input)."""
    text = os.environ.get(ENV)
    if not text:
        return None
    try:
        return parse_inputs(json.loads(text))
    except (ValueError, RecursionError) as exc:
        raise InputsError(f"{ENV}: {str(exc)[:200]}") from None
