"""One pass of a staged model under a per-layer placement: the schedule of
:mod:`packrat.plan.gpu.layerplan` executed by a device's two streams.

The ordering is not decided here: :func:`~packrat.plan.gpu.layerplan.schedule` says which copy each
run waits for, :func:`~packrat.plan.gpu.layerplan.interleave` the order to submit the operations
in; this module only binds them to tensors: a ``copy`` fills the stage's scratch buffers from
pinned host memory (``non_blocking`` on CUDA's copy stream), a ``run`` calls the stage with
the weights its placement names (resident device copies, the scratch buffers just filled, or
mapped host memory read in place). On the CPU stand-in the same code runs on two threads.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from packrat.plan.gpu.layerplan import Op, Placement, interleave, schedule
from packrat.runtime.gpu.device import Device
from packrat.runtime.gpu.stages import StagedModel

__all__ = ["HostWeights", "ModelMemory", "run_pass"]


ALIGN = 256  # bytes: every tensor in a packed buffer starts aligned for any dtype's view


@dataclass(frozen=True)
class HostWeights:
    """A model's weights packed per stage: each stage's owned tensors in one pinned byte
    buffer, so a stage moves host-to-device in one copy (PipeSwitch packs layers the same way;
    one copy per tensor would cost ResNet-50 some 320 copy launches), and a device buffer of
    the same layout gives every tensor as a typed view."""

    flats: tuple[Tensor | None, ...]  # per stage (None: owns nothing)
    slices: dict[str, tuple[int, int, int, torch.dtype, tuple[int, ...]]]  # stage, offset, bytes
    views: dict[str, Tensor]  # key -> its typed view in the host buffer

    @classmethod
    def pack(
        cls, staged: StagedModel, device: Device, tensors: dict[str, Tensor] | None = None
    ) -> HostWeights:
        src = staged.tensors if tensors is None else tensors
        slices: dict[str, tuple[int, int, int, torch.dtype, tuple[int, ...]]] = {}
        spans: list[tuple[int, int]] = []  # per stage: start and length in the model's buffer
        start = 0
        for i, stage in enumerate(staged.stages):
            offset = 0
            for k in stage.owned:
                t = src[k]
                nbytes = t.numel() * t.element_size()
                slices[k] = (i, offset, nbytes, t.dtype, tuple(t.shape))
                offset += -(-nbytes // ALIGN) * ALIGN
            spans.append((start, offset))
            start += offset
        # one pinned allocation per model (the pinned allocator rounds each up to a power of 2)
        whole = device.pinned_empty(start)
        flats: list[Tensor | None] = [whole[a : a + n] if n else None for a, n in spans]
        for k, sl in slices.items():
            flat = flats[sl[0]]
            assert flat is not None
            _typed(flat, sl).copy_(src[k])
        packed = cls(tuple(flats), slices, {})
        for k, sl in slices.items():
            host = flats[sl[0]]
            assert host is not None
            packed.views[k] = _typed(host, sl)
        return packed

    def typed(self, flat: Tensor, key: str) -> Tensor:
        """``key``'s tensor inside ``flat``, a buffer of its stage's layout (on any device)."""
        return _typed(flat, self.slices[key])

    @property
    def total_bytes(self) -> int:
        return sum(self.stage_bytes(i) for i in range(len(self.flats)))

    def stage_bytes(self, i: int) -> int:
        flat = self.flats[i]
        return 0 if flat is None else flat.numel()


def _typed(flat: Tensor, sl: tuple[int, int, int, torch.dtype, tuple[int, ...]]) -> Tensor:
    _, offset, nbytes, dtype, shape = sl
    return flat[offset : offset + nbytes].view(dtype).view(shape)


@dataclass
class ModelMemory:
    """A model's weights in the tier's two memories: every tensor pinned in host memory,
    packed per stage (:class:`HostWeights`), the resident ones also in device memory
    (``resident``: key -> device tensor, views of one buffer per stage)."""

    staged: StagedModel
    device: Device
    packed: HostWeights
    resident: dict[str, Tensor] = field(default_factory=dict)
    _mapped: dict[int, Tensor] = field(default_factory=dict)
    _steady: tuple[tuple[Placement, ...], list[dict[str, Tensor]]] | None = None

    @classmethod
    def pinned(
        cls, staged: StagedModel, device: Device, tensors: dict[str, Tensor] | None = None
    ) -> ModelMemory:
        return cls(staged, device, HostWeights.pack(staged, device, tensors))

    def sharing_host(self) -> ModelMemory:
        """Another memory of the same pinned weights with nothing resident (pools side by side)."""
        return ModelMemory(self.staged, self.device, self.packed)

    @property
    def host(self) -> dict[str, Tensor]:
        return self.packed.views

    def mapped(self, key: str) -> Tensor:
        """The device's view of the pinned host tensor ``key`` (direct host access)."""
        i = self.packed.slices[key][0]
        if i not in self._mapped:
            flat = self.packed.flats[i]
            assert flat is not None
            self._mapped[i] = self.device.mapped(flat)
        return self.packed.typed(self._mapped[i], key)

    def stage_on_device(self, i: int) -> dict[str, Tensor]:
        """Copy stage ``i``'s tensors to the device (one copy), as typed views."""
        flat = self.packed.flats[i]
        if flat is None:
            return {}
        dev = self.device.to_device(flat)
        return {k: self.packed.typed(dev, k) for k in self.staged.stages[i].owned}

    def put(self, tensors: dict[str, Tensor]) -> None:
        """Hold ``tensors`` (key -> device tensor) resident."""
        self.resident.update(tensors)
        self._changed()

    def drop(self, keys: Sequence[str] | None = None) -> None:
        """Evict ``keys`` (all when None) from the device."""
        for k in list(self.resident) if keys is None else keys:
            self.resident.pop(k, None)
        self._changed()

    def _changed(self) -> None:
        self._steady = None
        self.staged.unbind()  # no module may keep an evicted tensor alive

    def steady_weights(self, placements: tuple[Placement, ...]) -> list[dict[str, Tensor]]:
        """The per-stage weights of a pass that copies nothing (resident and in-place stages
        only), built once per residency and placement (so the stages stay bound between such
        passes: a warm model's requests)."""
        if self._steady is None or self._steady[0] != placements:
            self._steady = (placements, _weights(self, placements, {}))
        return self._steady[1]

    def resident_prefix(self, skip: frozenset[int] = frozenset()) -> int:
        """How many leading stages have every tensor they own on the device (the ``skip``
        stages, read in place even when warm, count as there)."""
        for i, s in enumerate(self.staged.stages):
            if i not in skip and any(k not in self.resident for k in s.owned):
                return i
        return len(self.staged.stages)

    def resident_bytes(self) -> int:
        """Device bytes held: the packed buffer of every stage with a tensor resident."""
        held = {self.packed.slices[k][0] for k in self.resident}
        return sum(self.packed.stage_bytes(i) for i in held)


def _weights(
    mem: ModelMemory,
    placements: Sequence[Placement],
    scratch: dict[str, Tensor],
    load_first: bool = False,
) -> list[dict[str, Tensor]]:
    """Per stage, the tensor each of its names reads in this pass (module doc of stages.py)."""
    owner = mem.staged.owner
    out: list[dict[str, Tensor]] = []
    for i, s in enumerate(mem.staged.stages):
        w: dict[str, Tensor] = {}
        for key in s.tensors.values():
            j = owner[key]
            if key in mem.resident:
                w[key] = mem.resident[key]
            elif placements[j] == "load" and (j <= i or load_first):
                w[key] = scratch[key]
            elif placements[j] == "resident":
                raise ValueError(
                    f"stage {mem.staged.stages[j].name} is placed resident but {key} is not"
                )
            elif j == i or placements[j] == "host":  # read in place: the owner's choice
                w[key] = mem.mapped(key)
            else:  # a later owner's tensor, not copied yet: in place where the device can
                try:
                    w[key] = mem.mapped(key)
                except (ValueError, RuntimeError, TypeError):
                    w[key] = mem.device.to_device(mem.host[key].contiguous())
        out.append(w)
    return out


@functools.lru_cache(maxsize=1024)
def _order(
    placements: tuple[Placement, ...], lookahead: int | None, load_first: bool
) -> tuple[tuple[str, Op], ...]:
    """The submission order of a placement's schedule (pure; cached: the pool repeats them)."""
    return tuple(interleave(schedule(placements, lookahead=lookahead, load_first=load_first)))


def run_pass(
    mem: ModelMemory,
    placements: Sequence[Placement],
    x: Tensor,
    *,
    lookahead: int | None = None,
    load_first: bool = False,
    log: list[tuple[str, str, int, float]] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Run the model once; returns its output (on the device) and the device buffers the pass
    loaded (key -> tensor), which the caller may keep resident or drop."""
    stages = mem.staged.stages
    if len(placements) != len(stages):
        raise ValueError(f"{len(placements)} placements for {len(stages)} stages")
    dev = mem.device
    flats = {
        i: dev.empty_like(flat)
        for i, flat in enumerate(mem.packed.flats)
        if placements[i] == "load" and flat is not None
    }
    scratch = {k: mem.packed.typed(flat, k) for i, flat in flats.items() for k in stages[i].owned}
    if "load" not in placements and log is None:
        steady = mem.steady_weights(tuple(placements))
        with torch.no_grad():  # nothing copied: nothing to order, no second stream
            for i, s in enumerate(stages):
                x = s.run(steady[i], x)
        return x, scratch
    weights = _weights(mem, placements, scratch, load_first)
    state = {"x": x}

    def copy(i: int) -> None:
        if i in flats:
            src = mem.packed.flats[i]
            assert src is not None
            dev.copy_into(flats[i], src)

    def run(i: int) -> None:
        with torch.no_grad():
            state["x"] = stages[i].run(weights[i], state["x"])

    def logged(stream: str, kind: str, i: int, fn: Callable[[], None]) -> Callable[[], None]:
        if log is None:
            return fn

        def wrapped() -> None:
            log.append((stream, f"{kind}-start", i, time.perf_counter()))
            fn()
            log.append((stream, f"{kind}-end", i, time.perf_counter()))

        return wrapped

    streams = dev.streams()
    for stream_name, op in _order(tuple(placements), lookahead, load_first):
        stream: Literal["copy", "compute"] = "copy" if stream_name == "copy" else "compute"
        if op.kind == "copy":
            streams.submit(
                stream, logged(stream, "copy", op.stage, functools.partial(copy, op.stage))
            )
        elif op.kind == "run":
            streams.submit(
                stream, logged(stream, "run", op.stage, functools.partial(run, op.stage))
            )
        elif op.kind == "signal":
            streams.signal(stream, (op.event, op.stage))
        else:
            streams.wait(stream, (op.event, op.stage))
    streams.finish()
    mem.staged.unbind()  # the scratch buffers must not outlive the pass through the modules
    return state["x"], scratch
