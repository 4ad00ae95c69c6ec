"""The engine contract: convert a model once, load the artefact on pinned cores, run batches.

An *engine* is what runs one thin instance's batches: eager PyTorch, an AOTInductor package,
ONNX Runtime or OpenVINO. Each is a small object with four duties:

- :meth:`Engine.missing`: why it cannot run here (its optional extra is not installed), or None;
- :meth:`Engine.convert`: turn the eager model and its input specs into files in a folder,
  once, in the profiling Job (the artefact; eager writes none);
- :meth:`Engine.load`: load the artefact with ``t`` intra-op threads and one inter-op thread
  in a process already pinned to its cores (:func:`packrat.runtime.pinning.pin_current_process`),
  started after any fork (ONNX Runtime's and OpenVINO's thread pools do not survive one);
- :meth:`Runner.run`: one batch, tensors in, tensors out; :meth:`Runner.memory`: the process's
  resident memory and how much of the artefact it maps from its files (shared by every
  instance on the node through the page cache).

Nothing outside :mod:`packrat.runtime.engines` imports an engine's own library.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor, nn

EAGER = "eager"
INDUCTOR = "inductor"
ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"


class EngineError(RuntimeError):
    """An engine is missing, failed to convert or load, or disagrees with eager."""


class EngineMissingError(EngineError):
    """The engine's optional extra is not installed (one clear line, never a traceback)."""


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input without its batch dimension (as the zoo and ``packrat.json`` give it)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int = 0  # integer token ids: values in [0, high)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        return cls(
            tuple(int(d) for d in data["shape"]),
            str(data.get("dtype", "float32")),
            int(data.get("high", 0)),
        )


def specs_digest(inputs: Sequence[InputSpec]) -> str:
    """A short, stable id of the input specs (part of an artefact's cache key)."""
    text = json.dumps([i.to_dict() for i in inputs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Runner(Protocol):
    """One loaded instance."""

    def run(self, inputs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]: ...

    def memory(self) -> dict[str, int]: ...


class Engine(Protocol):
    """One engine (see the module's docstring)."""

    name: str
    # whether load() may run in a process forked from one that imported the engine's library
    fork_safe: bool

    def missing(self) -> str | None: ...

    def version(self) -> str: ...

    def convert(
        self, model: nn.Module, inputs: Sequence[InputSpec], folder: Path
    ) -> Path | None: ...

    def load(self, artefact: Path | None, *, model: nn.Module | None, threads: int) -> Runner: ...


def missing_packages(engine: str, packages: Sequence[str]) -> str | None:
    """Why ``engine`` cannot run here: the first of its ``packages`` not installed (its extra,
    named as the engine, installs them), or None."""
    for package in packages:
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return (
                f"engine {engine}: the {package} package is not installed "
                f"(pip install 'packrat-operator[{engine}]')"
            )
    return None


def import_engine(module: str, engine: Engine) -> Any:
    """Import an engine's own library, or raise why the engine cannot run here."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise EngineMissingError(engine.missing()) from None


def one_or_tuple(outs: Sequence[Tensor]) -> Tensor | tuple[Tensor, ...]:
    """A batch's outputs as eager returns them: the tensor when there is one, else a tuple."""
    return outs[0] if len(outs) == 1 else tuple(outs)


class ArtefactRunner:
    """A runner of an artefact file: :meth:`memory` counts what it maps from its folder."""

    artefact: Path | None

    def memory(self) -> dict[str, int]:
        return memory_report(self.artefact)


def memory_report(artefact: Path | None) -> dict[str, int]:
    """This process's resident bytes, and the resident bytes it maps from the artefact's folder
    (file-backed, read-only: shared through the page cache by every instance on the node)."""
    rss = mapped = 0
    folder = str(artefact.parent.resolve()) if artefact is not None else None
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            current = ""
            for line in smaps:
                head = line.split(None, 1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a mapping's header line
                    parts = line.split()
                    current = parts[5] if len(parts) > 5 else ""
                elif head == "Rss:":
                    kib = int(line.split()[1]) * 1024
                    rss += kib
                    if folder is not None and current.startswith(folder):
                        mapped += kib
    except OSError:
        pass
    return {"rss_bytes": rss, "artefact_mapped_bytes": mapped}
