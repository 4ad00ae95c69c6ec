"""Engines that run a thin instance's batches (see :mod:`.base` for the contract).

``ENGINES`` names every engine Packrat knows; :func:`engine` returns one (whether or not its
extra is installed: ask :meth:`~.base.Engine.missing`), :func:`installed` those that can run
here. The engines' own libraries are imported by their modules only, when first used.
"""

from __future__ import annotations

from packrat.runtime.engines.base import (
    EAGER,
    INDUCTOR,
    ONNXRUNTIME,
    OPENVINO,
    Engine,
    EngineError,
    EngineMissingError,
    InputSpec,
    Runner,
)

__all__ = [
    "EAGER",
    "ENGINES",
    "INDUCTOR",
    "ONNXRUNTIME",
    "OPENVINO",
    "Engine",
    "EngineError",
    "EngineMissingError",
    "InputSpec",
    "Runner",
    "engine",
    "input_specs",
    "installed",
    "parse_engines",
]

ENGINES: tuple[str, ...] = (EAGER, INDUCTOR, ONNXRUNTIME, OPENVINO)


def engine(name: str) -> Engine:
    """The engine called ``name``; EngineError (one line) for an unknown name."""
    if name == EAGER:
        from packrat.runtime.engines.eager import Eager

        return Eager()
    if name == ONNXRUNTIME:
        from packrat.runtime.engines.ort import OnnxRuntime

        return OnnxRuntime()
    if name == OPENVINO:
        from packrat.runtime.engines.ov import OpenVino

        return OpenVino()
    if name == INDUCTOR:
        from packrat.runtime.engines.inductor import Inductor

        return Inductor()
    raise EngineError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")


def installed() -> list[str]:
    """The engines whose extras are installed here (eager always)."""
    return [name for name in ENGINES if engine(name).missing() is None]


def parse_engines(text: str, *, allow_missing: bool = False) -> list[str]:
    """``eager,openvino`` or ``all`` (every installed engine) -> names, eager first, checked:
    an unknown engine is one EngineError line, and so is a missing one unless
    ``allow_missing`` (then it stays, for the profile to leave out with its reason)."""
    if text.strip() == "all":
        return installed()
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        reason = engine(name).missing()
        if reason is not None and not allow_missing:
            raise EngineMissingError(reason)
    return sorted(names, key=lambda n: (n != EAGER, ENGINES.index(n)))


def input_specs(spec: str) -> tuple[InputSpec, ...]:
    """A zoo model's or described TorchScript file's inputs, as the engines take them."""
    from packrat.runtime.zoo import input_spec

    return tuple(InputSpec.from_dict(item) for item in input_spec(spec))
