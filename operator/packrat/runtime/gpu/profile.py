"""The per-stage profile the GPU tier's plans need, measured on the device.

For each stage, with the stage's real input (the activation the stages before it produce):
the bytes it owns (packed, with alignment); the host-to-device copy time of them from pinned
memory (one copy); its
execution time with every weight on the device; and its execution time reading its own weights
in place from mapped host memory (``None`` where a dtype cannot be viewed). Each time is the
median of ``repeat`` runs after one warm-up; on CUDA, timed with events around the work, so
launch gaps an idle GPU sees are in it (as they are in a cold pass).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from packrat.plan.gpu.layerplan import StageProfile
from packrat.runtime.gpu.executor import ModelMemory

__all__ = ["profile_stages"]


def _median(
    device_time: Callable[[Callable[[], Any]], float], fn: Callable[[], Any], repeat: int
) -> float:
    fn()  # warm-up: kernels chosen, buffers allocated
    return statistics.median(device_time(fn) for _ in range(repeat))


def profile_stages(mem: ModelMemory, x: Tensor, *, repeat: int = 5) -> list[StageProfile]:
    """Measure every stage of ``mem`` on its device (``x`` already there)."""
    dev = mem.device
    full = {k: t for i in range(len(mem.staged.stages)) for k, t in mem.stage_on_device(i).items()}
    acts = [x]
    with torch.no_grad():
        for s in mem.staged.stages:
            acts.append(s.run(full, acts[-1]))
    out: list[StageProfile] = []
    for i, s in enumerate(mem.staged.stages):
        owned = s.owned
        src = mem.packed.flats[i]
        buf = dev.empty_like(src) if src is not None else None

        def copy(src: Tensor | None = src, buf: Tensor | None = buf) -> None:
            if src is not None and buf is not None:  # the stage's one packed copy
                dev.copy_into(buf, src)

        def run(w: dict[str, Tensor], i: int = i) -> None:
            with torch.no_grad():
                mem.staged.stages[i].run(w, acts[i])

        copy_s = _median(dev.time_s, copy, repeat) if src is not None else 0.0
        exec_s = _median(dev.time_s, functools.partial(run, full), repeat)
        exec_host_s: float | None
        try:
            in_place = {**full, **{k: mem.mapped(k) for k in owned}}
            exec_host_s = _median(dev.time_s, functools.partial(run, in_place), repeat)
        except (ValueError, RuntimeError, TypeError):
            exec_host_s = None
        out.append(StageProfile(s.name, mem.packed.stage_bytes(i), copy_s, exec_s, exec_host_s))
    mem.staged.unbind()  # the profile's device copies must not stay alive through the modules
    return out
