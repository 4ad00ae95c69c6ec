"""The correctness gate: a converted engine is served only if it computes what eager does.

Compared on the model's sample input and on random batches of other sizes (1 and 3: an
engine that baked in the batch it was exported with fails on them). Tolerances per output
dtype, on the largest absolute difference, scaled by the output's magnitude:

- float32/float64: |engine - eager| <= 1e-4 + 1e-3 * max|eager|
- float16/bfloat16: |engine - eager| <= 1e-2 + 1e-2 * max|eager|
- integers and booleans (argmax, token ids): equal
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from packrat.runtime.engines.base import InputSpec, Runner
from packrat.runtime.engines.onnx_export import sample

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-3),
    "float64": (1e-4, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
BATCHES = (1, 3)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""
    worst: float = 0.0  # the largest difference / its allowance (<= 1 passes)


def _outputs(value: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def compare(got: Tensor | tuple[Tensor, ...], want: Tensor | tuple[Tensor, ...]) -> Verdict:
    """One batch's outputs against eager's."""
    g, w = _outputs(got), _outputs(want)
    if len(g) != len(w):
        return Verdict(False, f"{len(g)} outputs, eager has {len(w)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if tuple(a.shape) != tuple(b.shape):
            return Verdict(False, f"output {i}: shape {list(a.shape)}, eager {list(b.shape)}")
        dtype = str(b.dtype).removeprefix("torch.")
        if dtype not in TOLERANCES:
            if not torch.equal(a.to(b.dtype), b):
                return Verdict(False, f"output {i} ({dtype}) differs from eager")
            continue
        atol, rtol = TOLERANCES[dtype]
        ref = b.double()
        diff = float((a.double() - ref).abs().max()) if ref.numel() else 0.0
        allowed = atol + rtol * (float(ref.abs().max()) if ref.numel() else 0.0)
        if not diff <= allowed:  # NaN fails too
            return Verdict(
                False,
                f"output {i} ({dtype}): max |diff| {diff:.3g} > {allowed:.3g} allowed",
                diff / allowed,
            )
        worst = max(worst, diff / allowed)
    return Verdict(True, "", worst)


def check_engine(
    runner: Runner,
    eager: Runner,
    inputs: Sequence[InputSpec],
    *,
    sample_input: Sequence[Tensor] | None = None,
) -> Verdict:
    """The engine against eager on the sample input and random batches; a crash is a verdict."""
    batches: list[tuple[Tensor, ...]] = []
    if sample_input is not None:
        batches.append(tuple(sample_input))
    batches += [sample(inputs, b, seed=100 + b) for b in BATCHES]
    worst = 0.0
    for x in batches:
        try:
            got = runner.run(x)
        except Exception as exc:
            return Verdict(
                False, f"crashed on a batch of {x[0].shape[0]}: {type(exc).__name__}: {exc}"[:300]
            )
        verdict = compare(got, eager.run(x))
        if not verdict.ok:
            return Verdict(False, f"batch of {x[0].shape[0]}: {verdict.reason}", verdict.worst)
        worst = max(worst, verdict.worst)
    return Verdict(True, "", worst)
