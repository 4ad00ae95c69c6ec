"""The ONNX file that ONNX Runtime and OpenVINO both start from (opset 17, dynamic batch)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from packrat.runtime.engines.base import (
    EngineError,
    EngineMissingError,
    InputSpec,
    missing_packages,
)

OPSET = 17


class OnnxEngine:
    """What ONNX Runtime and OpenVINO share as engines: both convert from :func:`export_onnx`
    (so each needs the ``onnx`` package besides its own library), both take their version from
    that library, and both load nothing but an artefact."""

    name: str
    package: str  # the engine's own library: its distribution's and its module's name

    def missing(self) -> str | None:
        return missing_packages(self.name, (self.package, "onnx"))

    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def to_load(self, artefact: Path | None) -> Path:
        """The artefact :meth:`load` was given (there must be one)."""
        if artefact is None:
            raise EngineError(f"{self.name}: no artefact to load")
        return artefact


def sample(inputs: Sequence[InputSpec], batch: int, *, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A deterministic random batch for the specs (float: normal; integer: ids below high)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for spec in inputs:
        dtype = getattr(torch, spec.dtype)
        shape = (batch, *spec.shape)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=generator, dtype=dtype))
        else:
            out.append(torch.randint(0, spec.high or 2, shape, generator=generator, dtype=dtype))
    return tuple(out)


def export_onnx(model: nn.Module, inputs: Sequence[InputSpec], path: Path) -> Path:
    """Export ``model`` to ``path`` with every input's and output's first axis dynamic (a
    user's ONNX file is copied as it is, with its checked external data)."""
    from packrat.runtime.engines.onnx_file import OnnxModule, copy_model

    if isinstance(model, OnnxModule):
        return copy_model(model.onnx_path, path)
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
    except ImportError:
        raise EngineMissingError(
            "the onnx package is not installed (pip install 'packrat-operator[onnxruntime]')"
        ) from None
    example = sample(inputs, 2)
    with torch.inference_mode():
        out = model(*example)
    n_out = len(out) if isinstance(out, (list, tuple)) else 1
    names_in = [f"input{i}" for i in range(len(inputs))]
    names_out = [f"output{i}" for i in range(n_out)]
    axes = {name: {0: "batch"} for name in names_in + names_out}
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                example,
                str(path),
                input_names=names_in,
                output_names=names_out,
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,  # the TorchScript exporter: takes scripted modules too
            )
    except Exception as exc:
        raise EngineError(f"ONNX export failed: {type(exc).__name__}: {exc}"[:500]) from None
    return path
