"""The Open Inference Protocol (v2, KServe / Triton) REST codec, pure: JSON tensors (and the
binary tensor extension) in, one raw Packrat request body per sample out; sample answers
in, a v2 response out.

A v2 request carries tensors with a batch dimension: input ``k`` of shape ``[N, *s_k]``,
where ``s_k`` is the model's sample shape (``GET /v2/models/{name}``: ``[-1, *s_k]``). The
dispatcher splits it into N samples, each the raw little-endian bytes of every input's slice
concatenated (the body ``/predictions`` takes, :mod:`packrat.serve.codec`), so the samples of
one v2 request spread over the plan's thin instances like N separate requests. The answers
(each the model's output row as JSON) are stacked again into ``output__0`` of shape
``[N, *row]``. A user's ``.mar`` (its inputs unknown to Packrat) takes one ``BYTES`` input of
shape ``[N]``, each element one request body, and answers one ``BYTES`` output.

Inputs are named as the model file or its declaration names them (``--inputs``), else
``input__0``, ``input__1``, ... (PyTorch's convention in Triton); a request
whose names are exactly those is matched by name, any other by position. Every malformed
request is a :class:`V2Error` (a 400 with ``{"error": ...}``), whatever Python trips over.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_SAMPLES",
    "InferRequest",
    "Tensor",
    "V2Error",
    "build_response",
    "check_declared",
    "model_config",
    "model_metadata",
    "output_metadata",
    "parse_request",
    "refuse_classification",
    "request_spec",
    "split_samples",
]

MAX_SAMPLES = 1024  # samples in one v2 request at most; the dispatcher caps it at the plan's batch
MAX_DEPTH = 64  # nesting of a JSON "data" array
OUTPUT = "output__0"

# v2 datatype -> (array typecode, torch dtype name, element size)
_NUMERIC = {
    "BOOL": ("B", "bool", 1),
    "UINT8": ("B", "uint8", 1),
    "INT8": ("b", "int8", 1),
    "INT16": ("h", "int16", 2),
    "INT32": ("i", "int32", 4),
    "INT64": ("q", "int64", 8),
    "FP32": ("f", "float32", 4),
    "FP64": ("d", "float64", 8),
}
_BY_TORCH = {torch_name: v2 for v2, (_, torch_name, _) in _NUMERIC.items()}


class V2Error(ValueError):
    """A request the protocol or the model cannot take: 400, ``{"error": str(self)}``."""


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input tensor: numeric data as raw little-endian bytes, or BYTES elements."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes = b""
    items: tuple[bytes, ...] = ()
    content_type: str = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: tuple[Tensor, ...]
    binary: Mapping[str, bool] = field(default_factory=dict)  # requested output -> binary
    binary_default: bool = False


class Unchecked:
    """The marker for "no model to check the declared inputs against" (the codec alone)."""


UNCHECKED = Unchecked()


def input_name(k: int) -> str:
    return f"input__{k}"


def input_names(inputs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The model's input names: those its file or declaration gives, else ``input__k``."""
    return [str(item.get("name") or input_name(k)) for k, item in enumerate(inputs)]


def model_metadata(
    name: str,
    inputs: Sequence[Mapping[str, Any]] | None,
    output: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the inputs with a variable batch dimension, and the output
    as the model answers (``output``: :func:`output_metadata` of an answer it gave; before the
    pod has one, FP32 of unknown shape)."""
    if inputs is None:
        ins = [{"name": input_name(0), "datatype": "BYTES", "shape": [-1]}]
        outs = [{"name": OUTPUT, "datatype": "BYTES", "shape": [-1]}]
    else:
        ins = [
            {
                "name": name,
                "datatype": _BY_TORCH.get(str(item["dtype"]), "BYTES"),
                "shape": [-1, *(int(d) for d in item["shape"])],
            }
            for name, item in zip(input_names(inputs), inputs, strict=True)
        ]
        shape = list(output["shape"]) if output else [-1, -1]
        dtype = str(output["datatype"]) if output else "FP32"
        outs = [{"name": OUTPUT, "datatype": dtype, "shape": shape}]
    return {"name": name, "versions": ["1"], "platform": "pytorch", "inputs": ins, "outputs": outs}


def output_metadata(answer: bytes) -> dict[str, Any] | None:
    """The output's datatype and shape (``[-1, *row]``) from one sample's answer (a JSON row,
    as infer stacks it), or None when it is not one."""
    try:
        datatype, shape, _ = stack_answers([answer])
    except (ValueError, TypeError, RecursionError, V2Error):
        return None
    return {"datatype": datatype, "shape": [-1, *shape[1:]]}


_CONFIG_TYPES = {k: f"TYPE_{'STRING' if k == 'BYTES' else k}" for k in [*_NUMERIC, "BYTES"]}


def model_config(meta: Mapping[str, Any], max_batch: int) -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: the model's configuration as Triton's model
    configuration JSON (what tritonclient's ``get_model_config`` reads), from its metadata:
    the batch dimension is ``max_batch_size``, ``dims`` the rest."""

    def tensors(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": t["name"],
                "data_type": _CONFIG_TYPES.get(str(t["datatype"]), "TYPE_STRING"),
                "dims": list(t["shape"][1:]) or [1],
            }
            for t in items
        ]

    return {
        "name": meta["name"],
        "platform": "pytorch_libtorch",
        "backend": "packrat",
        "max_batch_size": max_batch,
        "input": tensors(meta["inputs"]),
        "output": tensors(meta["outputs"]),
    }


# -- requests ---------------------------------------------------------------------------------
def parse_request(
    body: bytes,
    header_length: int | None,
    model: Sequence[Mapping[str, Any]] | Unchecked | None = UNCHECKED,
    *,
    max_samples: int = MAX_SAMPLES,
) -> InferRequest:
    """A v2 infer request: JSON, or (binary extension) ``header_length`` bytes of JSON then
    the binary tensors in input order. Raises :class:`V2Error` only.

    ``model``: the model's inputs (None: a user's .mar, one BYTES input): every input's
    declared name, datatype and shape is checked against them, with at most ``max_samples``
    samples, before any ``data`` array is flattened, so a request the model cannot take
    costs one ``json.loads`` and no more (issue 38)."""
    try:
        return _parse(body, header_length, model, max_samples)
    except V2Error:
        raise
    except RecursionError:
        raise V2Error("the request is nested too deeply") from None
    except Exception as exc:  # a hostile request fails alone, whatever it trips over
        raise V2Error(f"malformed inference request: {type(exc).__name__}: {exc}"[:300]) from None


def _parse(
    body: bytes,
    header_length: int | None,
    model: Sequence[Mapping[str, Any]] | Unchecked | None,
    max_samples: int,
) -> InferRequest:
    if header_length is not None and not 0 < header_length <= len(body):
        raise V2Error(f"Inference-Header-Content-Length {header_length} is not within the body")
    head = body[:header_length] if header_length is not None else body
    try:
        doc = json.loads(head)
    except ValueError as exc:
        raise V2Error(f"the request is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise V2Error("the request must be a JSON object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise V2Error("'inputs' must be a non-empty array")
    if not isinstance(model, Unchecked):
        check_declared(inputs, model, max_samples)
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    tensors, offset = [], 0
    for k, spec in enumerate(inputs):
        tensor, used = _tensor(spec, k, binary[offset:])
        tensors.append(tensor)
        offset += used
    if offset != len(binary):
        raise V2Error(f"{len(binary) - offset} binary bytes are not claimed by any input")
    params = _object(doc.get("parameters", {}), "parameters")
    binary_default = bool(params.get("binary_data_output", False))
    wanted: dict[str, bool] = {}
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list):
        raise V2Error("'outputs' must be an array")
    for requested in outputs:
        out = _object(requested, "an output")
        oparams = _object(out.get("parameters", {}), "an output's parameters")
        refuse_classification(oparams)
        wanted[_string(out.get("name"), "an output's name")] = bool(
            oparams.get("binary_data", binary_default)
        )
    req_id = doc.get("id")
    return InferRequest(
        id=str(req_id) if req_id is not None else None,
        inputs=tuple(tensors),
        binary=wanted,
        binary_default=binary_default,
    )


CLASSIFICATION = ("classification", "class_count")


def refuse_classification(params: Mapping[str, Any]) -> None:
    """The classification extension (an output's ``classification``/``class_count``) is not
    served: a clear 400 rather than an answer that silently ignores it."""
    if any(key in params for key in CLASSIFICATION):
        raise V2Error(
            "the classification extension is not supported: ask for output__0 and take its "
            "top classes on the client"
        )


def check_declared(
    declared: Sequence[Any], model: Sequence[Mapping[str, Any]] | None, max_samples: int
) -> None:
    """The request's inputs as declared (name, datatype, shape; not their data) against the
    model's: the same count, datatypes and sample shapes, one batch size of 1..``max_samples``.
    Cheap: it reads no ``data`` array."""
    heads = [_object(spec, f"input {k}") for k, spec in enumerate(declared)]
    shapes = []
    for k, head in enumerate(heads):
        name = _string(head.get("name"), f"input {k}'s name")
        shape = head.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise V2Error(f"input {name}: 'shape' must be an array of non-negative integers")
        shapes.append((name, head.get("datatype"), shape))
    if model is None:  # a .mar: one BYTES input of shape [N]
        if len(shapes) != 1 or shapes[0][1] != "BYTES" or len(shapes[0][2]) != 1:
            raise V2Error("this model takes one BYTES input of shape [N]")
        _check_count(shapes[0][2][0], max_samples)
        return
    if len(shapes) != len(model):
        raise V2Error(f"the model takes {len(model)} input(s), got {len(shapes)}")
    names = input_names(model)
    if sorted(n for n, _, _ in shapes) == sorted(names):
        shapes.sort(key=lambda t: names.index(t[0]))
    batches = set()
    for (name, datatype, shape), item in zip(shapes, model, strict=True):
        want_type = _BY_TORCH.get(str(item["dtype"]))
        sample = [int(d) for d in item["shape"]]
        if datatype != want_type:
            raise V2Error(f"input {name}: datatype {datatype}, the model takes {want_type}")
        if len(shape) != len(sample) + 1 or shape[1:] != sample:
            raise V2Error(f"input {name}: shape {shape}, the model takes {[-1, *sample]}")
        batches.add(shape[0])
    if len(batches) != 1:
        raise V2Error("every input must have the same batch size (first dimension)")
    _check_count(batches.pop(), max_samples)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise V2Error(f"{what} must be a JSON object")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise V2Error(f"{what} must be a non-empty string")
    return value


def _tensor(spec: Any, k: int, binary: memoryview) -> tuple[Tensor, int]:
    spec = _object(spec, f"input {k}")
    name = _string(spec.get("name"), f"input {k}'s name")
    datatype = _string(spec.get("datatype"), f"input {name}'s datatype")
    shape = spec.get("shape")
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or len(shape) > 16
    ):
        raise V2Error(f"input {name}: 'shape' must be an array of non-negative integers")
    count = math.prod(shape)
    params = _object(spec.get("parameters", {}), f"input {name}'s parameters")
    ctype = str(params.get("content_type", "application/octet-stream"))
    size = params.get("binary_data_size")
    if datatype == "BYTES":
        items = _bytes_items(spec, name, count, binary, size)
        used = size if isinstance(size, int) else 0
        return Tensor(name, datatype, tuple(shape), items=items, content_type=ctype), used
    if datatype not in _NUMERIC:
        raise V2Error(f"input {name}: datatype {datatype} is not supported")
    code, _, width = _NUMERIC[datatype]
    if size is not None:
        if not isinstance(size, int) or size != count * width or size > len(binary):
            raise V2Error(f"input {name}: binary_data_size must be {count * width} bytes")
        return Tensor(name, datatype, tuple(shape), raw=bytes(binary[:size])), size
    flat = _flatten(spec.get("data"), name)
    if len(flat) != count:
        raise V2Error(f"input {name}: shape {shape} needs {count} values, got {len(flat)}")
    if datatype.startswith("FP"):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
            raise V2Error(f"input {name}: {datatype} data must be numbers")
    elif datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise V2Error(f"input {name}: BOOL data must be true or false")
    elif not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        raise V2Error(f"input {name}: {datatype} data must be integers")
    try:
        values = array(code, flat)
    except OverflowError:
        raise V2Error(f"input {name}: a value does not fit {datatype}") from None
    if sys.byteorder != "little":
        values.byteswap()
    return Tensor(name, datatype, tuple(shape), raw=values.tobytes()), 0


def _flatten(data: Any, name: str) -> list[Any]:
    """Row-major values of a nested (or already flat) JSON array, iteratively."""
    if not isinstance(data, list):
        raise V2Error(f"input {name}: 'data' must be an array (or use binary data)")
    out: list[Any] = []
    stack: list[tuple[list[Any], int, int]] = [(data, 0, 0)]
    while stack:
        items, i, depth = stack.pop()
        while i < len(items):
            v = items[i]
            i += 1
            if isinstance(v, list):
                if depth + 1 > MAX_DEPTH:
                    raise V2Error(f"input {name}: 'data' is nested too deeply")
                stack.append((items, i, depth))
                items, i, depth = v, 0, depth + 1
            else:
                out.append(v)
    return out


def _bytes_items(
    spec: dict[str, Any], name: str, count: int, binary: memoryview, size: Any
) -> tuple[bytes, ...]:
    if size is not None:  # 4-byte little-endian length, then the bytes, per element
        if not isinstance(size, int) or not 0 <= size <= len(binary):
            raise V2Error(f"input {name}: binary_data_size is not within the body")
        items = list(unpack_bytes(binary[:size], name))
    else:
        flat = _flatten(spec.get("data"), name)
        if not all(isinstance(v, str) for v in flat):
            raise V2Error(f"input {name}: BYTES data must be strings")
        items = [v.encode() for v in flat]
    if len(items) != count:
        raise V2Error(f"input {name}: shape needs {count} elements, got {len(items)}")
    return tuple(items)


def request_spec(req: InferRequest) -> list[dict[str, Any]]:
    """The inputs a request declares, as a model's input spec (dtype, sample shape): for a
    splitter that does not know the model (a pipeline's router; its first stage checks)."""
    spec = []
    for t in req.inputs:
        if t.datatype not in _NUMERIC or not t.shape:
            raise V2Error(f"input {t.name}: a numeric tensor with a batch dimension is needed")
        spec.append({"dtype": _NUMERIC[t.datatype][1], "shape": list(t.shape[1:])})
    return spec


def split_samples(
    req: InferRequest,
    inputs: Sequence[Mapping[str, Any]] | None,
    *,
    max_samples: int = MAX_SAMPLES,
) -> list[tuple[bytes, str]]:
    """One (body, content type) per sample of ``req``, for a model with ``inputs`` (None: a
    user's .mar, one BYTES element per request body)."""
    if inputs is None:
        one = req.inputs[0]
        if len(req.inputs) != 1 or one.datatype != "BYTES" or len(one.shape) != 1:
            raise V2Error("this model takes one BYTES input of shape [N]")
        t = req.inputs[0]
        _check_count(len(t.items), max_samples)
        return [(item, t.content_type) for item in t.items]
    if len(req.inputs) != len(inputs):
        raise V2Error(f"the model takes {len(inputs)} input(s), got {len(req.inputs)}")
    ordered = list(req.inputs)
    names = input_names(inputs)
    if sorted(t.name for t in ordered) == sorted(names):
        ordered.sort(key=lambda t: names.index(t.name))
    batch: int | None = None
    slices = []
    for t, item in zip(ordered, inputs, strict=True):
        want_type = _BY_TORCH.get(str(item["dtype"]))
        sample = tuple(int(d) for d in item["shape"])
        if t.datatype != want_type:
            raise V2Error(f"input {t.name}: datatype {t.datatype}, the model takes {want_type}")
        if len(t.shape) != len(sample) + 1 or t.shape[1:] != sample:
            raise V2Error(f"input {t.name}: shape {list(t.shape)}, the model takes {[-1, *sample]}")
        if batch is not None and t.shape[0] != batch:
            raise V2Error("every input must have the same batch size (first dimension)")
        batch = t.shape[0]
        slices.append((t.raw, len(t.raw) // batch if batch else 0))
    n = batch or 0
    _check_count(n, max_samples)
    octets = "application/octet-stream"
    return [(b"".join(raw[i * w : (i + 1) * w] for raw, w in slices), octets) for i in range(n)]


def _check_count(n: int, max_samples: int) -> None:
    if not 1 <= n <= max_samples:
        raise V2Error(f"a request carries 1..{max_samples} samples (the model's batch), got {n}")


# -- responses --------------------------------------------------------------------------------
def build_response(
    model: str, req: InferRequest, answers: Sequence[bytes], *, raw_bytes: bool
) -> tuple[bytes, int | None]:
    """The v2 response for the samples' ``answers`` (JSON rows; or, ``raw_bytes``, a .mar's
    bodies as BYTES), and the JSON header's length when any output is binary."""
    check_outputs(req)
    binary = req.binary.get(OUTPUT, req.binary_default)
    if raw_bytes:
        out: dict[str, Any] = {"name": OUTPUT, "datatype": "BYTES", "shape": [len(answers)]}
        data: bytes | None = pack_bytes(answers) if binary else None
        if not binary:
            out["data"] = [a.decode(errors="replace") for a in answers]
    else:
        dtype, shape, flat = stack_answers(answers)
        out = {"name": OUTPUT, "datatype": dtype, "shape": shape}
        data = pack(dtype, flat) if binary else None
        if not binary:
            out["data"] = flat
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": [out]}
    if req.id is not None:
        doc["id"] = req.id
    if data is None:
        return json.dumps(doc, separators=(",", ":")).encode(), None
    out["parameters"] = {"binary_data_size": len(data)}
    head = json.dumps(doc, separators=(",", ":")).encode()
    return head + data, len(head)


def check_outputs(req: InferRequest) -> None:
    """Only the model's one output may be asked for."""
    unknown = [n for n in req.binary if n != OUTPUT]
    if unknown:
        raise V2Error(f"unknown output {unknown[0]!r}: this model has {OUTPUT}")


def stack_answers(answers: Sequence[bytes]) -> tuple[str, list[int], list[Any]]:
    """The samples' JSON rows as one tensor: datatype (FP32 when any value is a float,
    INT64 otherwise), shape ``[N, *row]`` and row-major values. ValueError: rows that do not
    stack (the model's fault, not the client's)."""
    rows = [json.loads(a) for a in answers]
    shape, flat = _stack(rows)
    dtype = "FP32" if any(isinstance(v, float) for v in flat) else "INT64"
    return dtype, shape, flat


def pack(datatype: str, flat: Sequence[Any]) -> bytes:
    """Row-major values as the protocol's raw little-endian bytes."""
    values = array(_NUMERIC[datatype][0], flat)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def pack_bytes(items: Sequence[bytes]) -> bytes:
    """BYTES elements as raw contents: each a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(a)) + a for a in items)


def unpack_bytes(raw: bytes | memoryview, name: str) -> tuple[bytes, ...]:
    """The BYTES elements of raw contents (:func:`pack_bytes`); V2Error when truncated."""
    items, offset, size = [], 0, len(raw)
    while offset < size:
        if offset + 4 > size:
            raise V2Error(f"input {name}: a BYTES element is truncated")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > size:
            raise V2Error(f"input {name}: a BYTES element is truncated")
        items.append(bytes(raw[offset : offset + length]))
        offset += length
    return tuple(items)


def numeric_raw(name: str, datatype: str, values: Sequence[Any]) -> bytes:
    """Typed values (a gRPC request's contents) as raw little-endian bytes of ``datatype``."""
    if datatype not in _NUMERIC:
        raise V2Error(f"input {name}: datatype {datatype} is not supported")
    try:
        out = array(_NUMERIC[datatype][0], values)
    except (OverflowError, TypeError):
        raise V2Error(f"input {name}: a value does not fit {datatype}") from None
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def element_size(datatype: str) -> int | None:
    """Bytes per element of a numeric datatype (None: BYTES or unknown)."""
    entry = _NUMERIC.get(datatype)
    return entry[2] if entry else None


def _stack(rows: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """The shape ``[N, *row]`` and the row-major values of equally shaped nested rows."""
    shape: list[int] = [len(rows)]
    probe: Any = rows[0] if rows else []
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    flat = _flatten(list(rows), OUTPUT)
    if math.prod(shape) != len(flat):
        raise ValueError("the model's answers are not equally shaped")
    return shape, flat
