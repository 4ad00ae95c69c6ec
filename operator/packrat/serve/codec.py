"""The wire format of Packrat's native handler: one request carries one sample.

A request body is either JSON (the sample as nested lists; a list of such per input when the
model takes several inputs) or raw little-endian bytes of every input concatenated, shapes
and dtypes from the model's input description (``packrat.runtime.zoo.input_spec``). The
answer is JSON: the model's output row for that sample. Raw bytes keep a ResNet-50 image at
588 KiB instead of megabytes of JSON text; JSON keeps curl usable.

Shared by the worker-side handler (decode, encode answers) and the load generator (encode
samples). Every decoding failure, whatever Python raises underneath (``RecursionError`` for
deeply nested JSON, ``ValueError`` for an integer of thousands of digits, ``OverflowError``,
``MemoryError`` for an absurd shape), becomes :class:`CodecError`, which the handler turns
into a 400 for that request alone.
"""

from __future__ import annotations

import json
import math
import random
import sys
from array import array
from collections.abc import Sequence
from typing import Any

# The raw formats a body can be written in without torch (array's typecodes).
_ARRAY_CODES = {
    "float32": "f",
    "float64": "d",
    "int64": "q",
    "int32": "i",
    "int16": "h",
    "int8": "b",
    "uint8": "B",
}


class CodecError(ValueError):
    """A request body that does not decode to one sample of the model's input."""


def _sample_bytes(inputs: Sequence[dict[str, Any]]) -> int:
    import torch

    total = 0
    for item in inputs:
        dtype = getattr(torch, str(item["dtype"]))
        total += (
            math.prod(int(d) for d in item["shape"]) * torch.empty((), dtype=dtype).element_size()
        )
    return total


def decode_sample(body: Any, inputs: Sequence[dict[str, Any]] | None) -> list[Any]:
    """One tensor per model input for one sample (no batch dimension).

    Raises :class:`CodecError` and nothing else for any body, however malformed.
    """
    try:
        return _decode(body, inputs)
    except CodecError:
        raise
    except RecursionError:
        raise CodecError("body is nested too deeply") from None
    except Exception as exc:  # a hostile body must fail alone, whatever it trips over
        raise CodecError(f"body does not decode: {type(exc).__name__}: {_short(exc)}") from None


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= limit else text[:limit] + "..."


def _no_constant(name: str) -> Any:
    raise CodecError(f"body has {name}: inputs must be finite numbers")


def _finite(tensors: list[Any]) -> list[Any]:
    """``tensors``, or :class:`CodecError` when one holds NaN or an infinity (JSON's 1e999
    parses to one): the model would answer with them, which JSON cannot carry."""
    import torch

    for i, t in enumerate(tensors):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CodecError(f"input {i} has NaN or infinite values: inputs must be finite")
    return tensors


def _in_range(tensors: list[Any], inputs: Sequence[dict[str, Any]] | None) -> list[Any]:
    """``tensors``, or :class:`CodecError` when an integer input declared with ``high`` (token
    ids: ``[0, high)``) holds one outside: the model's embedding would refuse it with an
    IndexError (a 500 in the pool; in a pod, the whole batch run again one by one)."""
    for i, (t, item) in enumerate(zip(tensors, inputs or (), strict=False)):
        high = int(item.get("high") or 0)
        if high > 0 and not t.is_floating_point() and t.numel() > 0:
            low, top = int(t.min()), int(t.max())
            if low < 0 or top >= high:
                bad = low if low < 0 else top
                raise CodecError(f"input {i} has id {bad}: ids are in 0..{high - 1}")
    return tensors


def _decode(body: Any, inputs: Sequence[dict[str, Any]] | None) -> list[Any]:
    return _in_range(_finite(_decode_any(body, inputs)), inputs)


def _decode_any(body: Any, inputs: Sequence[dict[str, Any]] | None) -> list[Any]:
    import torch

    if isinstance(body, (bytes, bytearray)):
        if inputs and len(body) == _sample_bytes(inputs):
            tensors: list[Any] = []
            offset = 0
            for item in inputs:
                dtype = getattr(torch, str(item["dtype"]))
                count = math.prod(int(d) for d in item["shape"])
                tensor = torch.frombuffer(bytearray(body), dtype=dtype, count=count, offset=offset)
                tensors.append(tensor.reshape([int(d) for d in item["shape"]]).clone())
                offset += tensor.numel() * tensor.element_size()
            return tensors
        try:
            body = json.loads(bytes(body).decode("utf-8"), parse_constant=_no_constant)
        except CodecError:
            raise
        except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
            expected = f"{_sample_bytes(inputs)} raw bytes or " if inputs else ""
            raise CodecError(
                f"body is neither {expected}JSON ({len(body)} bytes received)"
            ) from None
    if isinstance(body, str):
        try:
            body = json.loads(body, parse_constant=_no_constant)
        except CodecError:
            raise
        except ValueError:
            raise CodecError("body is not valid JSON") from None
    if isinstance(body, dict) and "inputs" in body:
        body = body["inputs"]
    if not isinstance(body, list):
        raise CodecError(f"expected a JSON array, got {type(body).__name__}")
    parts = body if inputs and len(inputs) > 1 else [body]
    if inputs and len(parts) != len(inputs):
        raise CodecError(f"expected {len(inputs)} inputs, got {len(parts)}")
    tensors = []
    for i, part in enumerate(parts):
        item = inputs[i] if inputs else {"dtype": "float32", "shape": None}
        try:
            tensor = torch.tensor(part, dtype=getattr(torch, str(item["dtype"])))
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise CodecError(f"input {i} is not a numeric array: {_short(exc)}") from None
        if not tensor.is_floating_point() and tensor.dtype != torch.bool:
            as_given = torch.tensor(part)  # 1.5 for an integer input: refused, not truncated
            if as_given.is_floating_point() and not bool((as_given == as_given.trunc()).all()):
                raise CodecError(f"input {i} holds non-integers: it takes {item['dtype']}")
        shape = item.get("shape")
        if shape is not None and list(tensor.shape) != [int(d) for d in shape]:
            raise CodecError(f"input {i} has shape {list(tensor.shape)}, expected {list(shape)}")
        tensors.append(tensor)
    return tensors


def encode_sample(tensors: Sequence[Any]) -> bytes:
    """Raw bytes of one sample (tensors without the batch dimension), inputs concatenated."""
    return b"".join(t.contiguous().numpy().tobytes() for t in tensors)


def encode_output(result: Any, row: int) -> str:
    """The JSON answer for sample ``row`` of a batched model output (first output if several)."""
    if isinstance(result, (tuple, list)):
        result = result[0]
    if isinstance(result, dict):
        result = next(iter(result.values()))
    values = result[row].tolist()
    try:
        return json.dumps(values, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or an infinity in the output: JSON's null, never bare NaN
        return json.dumps(_nulls(values), separators=(",", ":"))


def _nulls(value: Any) -> Any:
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# bytes per element of the dtypes a model input can have, without torch
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "bool": 1, "complex64": 8}
JSON_BYTES_PER_RAW_BYTE = 8  # a float32 as JSON text: up to ~25 characters for 4 bytes
MIN_BODY_CAP = 64 * 1024


def input_body_cap(inputs: Sequence[dict[str, Any]], ceiling: int) -> int:
    """The largest request body worth reading for one sample of ``inputs``: its raw size as
    JSON text (with room), at least 64 KiB, at most ``ceiling`` (the pod's cap). Beyond it a
    body cannot be one sample, and parsing it would cost a worker seconds of CPU."""
    raw = 0
    for item in inputs:
        dtype = str(item["dtype"])
        size = _ELEMENT_BYTES.get(dtype)
        if size is None:
            code = _ARRAY_CODES.get(dtype)
            if code is None:
                return ceiling  # an unknown dtype: no tighter cap than the pod's
            size = array(code).itemsize
        raw += math.prod(int(d) for d in item["shape"]) * size
    return min(ceiling, max(MIN_BODY_CAP, JSON_BYTES_PER_RAW_BYTE * raw))


def example_body(spec: str) -> bytes:
    """A valid raw request body for a zoo model or described TorchScript file: its example
    input of batch 1 (deterministic)."""
    from packrat.runtime import zoo

    example = zoo.example_input(spec, 1)
    tensors = example if isinstance(example, tuple) else (example,)
    return encode_sample([t[0] for t in tensors])


def warmup_body(inputs: Sequence[dict[str, Any]], *, seed: int = 0) -> bytes | None:
    """A valid raw body of one sample, made without torch (the serving pod's dispatcher
    never imports it): deterministic pseudo-random floats in [-1, 1) and integers in
    [0, high). None for an input dtype :mod:`array` cannot write (then use
    :func:`example_body`)."""
    rng = random.Random(seed)
    parts = []
    for item in inputs:
        code = _ARRAY_CODES.get(str(item["dtype"]))
        if code is None:
            return None
        count = math.prod(int(d) for d in item["shape"])
        if code in "fd":
            values = array(code, [2.0 * rng.random() - 1.0 for _ in range(count)])
        else:
            high = int(item.get("high") or 2)
            values = array(code, [rng.randrange(high) for _ in range(count)])
        if sys.byteorder != "little":
            values.byteswap()
        parts.append(values.tobytes())
    return b"".join(parts)
