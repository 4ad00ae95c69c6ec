"""The built-in model zoo, and loading a user's TorchScript file, behind one ``spec`` string.

Packrat's decisions depend on latency, not on accuracy, so the zoo defines each model's
architecture faithfully (same layers, shapes and parameter counts as the reference
implementations) with random weights from a fixed seed: no downloads, no torchvision (its
PyPI wheels do not import beside the CPU torch build), identical models on every machine.

A ``spec`` is a zoo name (``resnet50``, ``inception_v3``, ``bert-base``, ``gpt2``, ``tiny``,
optionally prefixed ``zoo:``) or a path to a model file: TorchScript (``.pt``/``.pth``/``.ts``),
a ``torch.export`` program (``.pt2``) or ONNX (``.onnx``, run on ONNX Runtime:
:mod:`packrat.runtime.engines.onnx_file`). A file's inputs (shapes without the batch
dimension) are, first found: those declared for it (``--inputs``, ``spec.model.inputs``:
:mod:`packrat.runtime.inputs`, checked against an ONNX graph); an ONNX graph's own; a
``.pt2``'s example inputs (their first dimension taken as the batch); a TorchScript file's
extra file ``packrat.json`` written by :func:`save_torchscript`
(``{"inputs": [{"shape": [3, 224, 224], "dtype": "float32"}]}``). A file whose inputs none
of these gives is one :class:`ZooError` line.

The architectures live in one module per family (:mod:`~packrat.runtime.zoo.tiny`,
:mod:`~packrat.runtime.zoo.resnet`, :mod:`~packrat.runtime.zoo.inception`,
:mod:`~packrat.runtime.zoo.transformer`); this module is the registry and everything that
takes a ``spec``.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from packrat.runtime import inputs as declared_inputs
from packrat.runtime import modelid
from packrat.runtime.zoo.inception import InceptionV3
from packrat.runtime.zoo.resnet import ResNet50
from packrat.runtime.zoo.tiny import Tiny
from packrat.runtime.zoo.transformer import GPT2, BertBase

__all__ = [
    "ZOO_NAMES",
    "ZooError",
    "check_model",
    "example_input",
    "input_spec",
    "is_zoo_name",
    "load_model",
    "model_digest",
    "model_name",
    "save_torchscript",
    "tiny",
]

SEED = modelid.SEED
EXTRA_FILE = "packrat.json"


class ZooError(ValueError):
    """Unknown zoo name, unreadable model file or missing input description."""


def tiny() -> nn.Module:
    """The tiny test model, built with the zoo's seed, in eval mode."""
    return _seeded(Tiny)


# -- the registry ----------------------------------------------------------------------------
# Names, versions and input descriptions live in packrat.runtime.modelid (torch-free, for
# the serving pod's dispatcher); the architectures and torch dtypes are added here.
@dataclass(frozen=True, slots=True)
class _Input:
    shape: tuple[int, ...]  # without the batch dimension
    dtype: torch.dtype
    high: int = 0  # for integer token ids: values in [0, high)
    name: str = ""  # as the file or its declaration names it (v2 metadata); "" for the zoo's


@dataclass(frozen=True, slots=True)
class _Entry:
    build: Callable[[], nn.Module]
    inputs: tuple[_Input, ...]


_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "resnet50": ResNet50,
    "inception_v3": InceptionV3,
    "bert-base": BertBase,
    "gpt2": GPT2,
    "tiny": Tiny,
}
_ZOO: dict[str, _Entry] = {
    name: _Entry(
        _BUILDERS[name],
        tuple(_Input(i.shape, getattr(torch, i.dtype), i.high) for i in entry.inputs),
    )
    for name, entry in modelid.ZOO.items()
}
ZOO_NAMES: tuple[str, ...] = modelid.ZOO_NAMES
_zoo_key = modelid.zoo_key
is_zoo_name = modelid.is_zoo_name
model_name = modelid.model_name


def _seeded(build: Callable[[], nn.Module], seed: int = SEED) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _model_path(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".mar":
        raise ZooError(
            f"{spec}: a .mar archive is served by TorchServe; load_model takes a zoo name "
            f"({', '.join(ZOO_NAMES)}) or a model file (.pt, .pt2, .onnx)"
        )
    if not path.is_file():
        raise ZooError(modelid.unknown_model(spec))
    return path


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """TorchScript is the user-facing format here; torch 2.x flags it deprecated on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


class _Exported(nn.Module):
    """A ``torch.export`` program as a module: its unlifted graph module, which refuses
    ``train``/``eval`` (an exported program has one mode), behind a module that accepts them."""

    def __init__(self, program: nn.Module) -> None:
        super().__init__()
        self.program = program

    def forward(self, *inputs: Tensor) -> Any:
        return self.program(*inputs)

    def train(self, mode: bool = True) -> _Exported:
        self.training = mode  # the program keeps the mode it was exported in
        return self


def _exported(path: Path) -> Any:
    try:
        return torch.export.load(str(path))
    except Exception as exc:  # a corrupt or foreign archive: one line, not a traceback
        raise ZooError(f"{path}: not a loadable torch.export program (.pt2): {exc}"[:300]) from None


def load_model(spec: str, *, seed: int | None = None) -> nn.Module:
    """Build a zoo model (random weights, fixed seed) or load a TorchScript file or a
    torch.export program (.pt2), in eval mode.

    ``seed`` builds a zoo model with other random weights (a pool's many instances of one
    architecture, each its own file and pages); model files ignore it."""
    key = _zoo_key(spec)
    if key is not None:
        return _seeded(_ZOO[key].build, SEED if seed is None else seed)
    path = _model_path(spec)
    if path.suffix.lower() == ".pt2":
        module = _Exported(_exported(path).module())
        for p in module.parameters():
            p.requires_grad_(False)
        return module.eval()
    if path.suffix.lower() == ".onnx":
        from packrat.runtime.engines.onnx_file import OnnxModule

        return OnnxModule(path).eval()
    try:
        with _quiet_jit():
            module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError) as exc:
        raise ZooError(f"{spec}: not a loadable TorchScript file: {exc}") from None
    module.eval()
    return module  # type: ignore[no-any-return]


def _exported_inputs(path: Path) -> tuple[_Input, ...] | None:
    """A .pt2's inputs: its example inputs without their first (batch) dimension."""
    examples = _exported(path).example_inputs
    args = examples[0] if examples else ()
    if not args or not all(isinstance(a, Tensor) and a.dim() >= 1 for a in args):
        return None
    return tuple(
        _Input(
            tuple(int(d) for d in a.shape[1:]),
            a.dtype,
            0 if a.dtype.is_floating_point or a.numel() == 0 else int(a.max()) + 1,
        )
        for a in args
    )


def _as_inputs(items: Sequence[dict[str, Any]]) -> tuple[_Input, ...]:
    return tuple(
        _Input(tuple(i["shape"]), getattr(torch, i["dtype"]), int(i["high"]), str(i["name"]))
        for i in items
    )


def _onnx_inputs(path: Path, declared: list[dict[str, Any]] | None) -> tuple[_Input, ...]:
    from packrat.runtime.engines import EngineError
    from packrat.runtime.engines.onnx_file import onnx_inputs

    try:
        return _as_inputs(onnx_inputs(path, declared))
    except (EngineError, declared_inputs.InputsError) as exc:
        raise ZooError(str(exc)) from None


def _file_inputs(path: Path) -> tuple[_Input, ...] | None:
    try:
        declared = declared_inputs.declared()
    except declared_inputs.InputsError as exc:
        raise ZooError(str(exc)) from None
    if path.suffix.lower() == ".onnx":
        return _onnx_inputs(path, declared)
    if path.suffix.lower() == ".pt2":
        own = _exported_inputs(path)  # loads it: a corrupt program is refused here too
        return own if declared is None else _as_inputs(declared)
    extra = {EXTRA_FILE: ""}
    try:
        with _quiet_jit():
            torch.jit.load(str(path), map_location="cpu", _extra_files=extra)  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError) as exc:
        raise ZooError(f"{path}: not a loadable TorchScript file: {exc}") from None
    text = extra[EXTRA_FILE]
    if declared is not None:
        return _as_inputs(declared)
    if not text:
        return None
    try:
        data = json.loads(text)
        return tuple(
            _Input(
                tuple(int(d) for d in item["shape"]),
                getattr(torch, str(item.get("dtype", "float32"))),
                int(item.get("high", 0)),
            )
            for item in data["inputs"]
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ZooError(f"{path}: malformed {EXTRA_FILE}: {exc}") from None


def input_spec(spec: str) -> list[dict[str, Any]]:
    """The model's inputs as JSON-able dicts ``{"shape", "dtype", "high"}`` (no batch dim),
    with ``"name"`` where the file or its declaration names them."""
    return [
        {
            "shape": list(i.shape),
            "dtype": str(i.dtype).removeprefix("torch."),
            "high": i.high,
            **({"name": i.name} if i.name else {}),
        }
        for i in _inputs(spec)
    ]


_DECLARE = "packrat profile/serve --inputs, spec.model.inputs"


def _inputs(spec: str) -> tuple[_Input, ...]:
    key = _zoo_key(spec)
    if key is not None:
        return _ZOO[key].inputs
    path = _model_path(spec)
    inputs = _file_inputs(path)
    if inputs is None and path.suffix.lower() == ".pt2":
        raise ZooError(
            f"{spec}: the torch.export program keeps no example inputs with a batch "
            f"dimension; declare its inputs ({_DECLARE}) or export it with example tensors "
            f"of shape (batch, ...)"
        )
    if inputs is None:
        raise ZooError(
            f"{spec}: the TorchScript file does not describe its inputs; declare them "
            f"({_DECLARE}) or save it with packrat.runtime.zoo.save_torchscript"
        )
    return inputs


def check_model(spec: str) -> list[dict[str, Any]]:
    """Load ``spec``, know its inputs and run a batch of 2 of them, or one ZooError line: the
    check a command makes before it starts any worker."""
    inputs = input_spec(spec)
    model = load_model(spec)
    example = example_input(spec, 2)
    args = example if isinstance(example, tuple) else (example,)
    try:
        with torch.inference_mode():
            model(*args)
    except Exception as exc:  # the model's own error, whatever it raises: one line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        text = lines[-1] if lines else ""  # TorchScript's own traceback ends with the error
        described = ", ".join(
            f"{i['dtype']}[-1, {', '.join(map(str, i['shape']))}]" for i in inputs
        )
        raise ZooError(
            f"{spec}: a batch of its inputs ({described}) fails: {type(exc).__name__}: {text}"[:400]
        ) from None
    return inputs


def example_input(spec: str, batch: int) -> Tensor | tuple[Tensor, ...]:
    """A deterministic random input of batch ``batch``: one tensor, or a tuple for several."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    generator = torch.Generator().manual_seed(SEED)
    tensors: list[Tensor] = []
    for item in _inputs(spec):
        shape = (batch, *item.shape)
        if item.dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator, dtype=item.dtype))
        else:
            high = item.high or 2
            tensors.append(torch.randint(0, high, shape, generator=generator, dtype=item.dtype))
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def save_torchscript(
    model: nn.Module | torch.jit.ScriptModule,
    path: str | Path,
    *,
    inputs: Sequence[tuple[Sequence[int], torch.dtype]],
) -> None:
    """Script (if needed) and save ``model`` with its input description, for ``load_model``."""
    with _quiet_jit():
        scripted = model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)
    meta = {
        "inputs": [
            {"shape": [int(d) for d in shape], "dtype": str(dtype).removeprefix("torch.")}
            for shape, dtype in inputs
        ]
    }
    with _quiet_jit():
        torch.jit.save(scripted, str(path), _extra_files={EXTRA_FILE: json.dumps(meta)})


def model_digest(spec: str) -> str:
    """A stable id of what would be loaded: zoo name + architecture version, or the sha256 of
    the file (TorchScript or .mar).

    Profiles are keyed by it, so a changed model (file content or zoo definition) is
    re-profiled and an unchanged one never is.
    """
    zoo_digest = modelid.model_digest(spec)
    if zoo_digest is not None:
        return zoo_digest
    mar = Path(spec).expanduser()
    path = mar if mar.suffix.lower() == ".mar" and mar.is_file() else _model_path(spec)
    return modelid.file_digest(path)


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
