"""Cold starts that overlap loading with compute: a model run layer by layer from its file.

A model built from a :class:`~packrat.runtime.layerfile.LayerFile` runs on the mapping; a
layer that is not in the page cache would be faulted in 4 KiB (plus read-around) at a time
by the kernel, on the compute thread. This module instead brings the missing layers in with
large sequential reads (through the pod's :class:`~packrat.runtime.layerfile.RateLimiter`),
in one of three ways, so that they can be compared on the same model and file:

- ``load``: load-then-run, every missing layer read before the forward pass starts (what a
  server that loads a model on its first request does);
- ``demand``: each missing layer read when the forward pass reaches it, on the compute
  thread (demand paging at layer granularity: no overlap, but no wasted reads either);
- ``prefetch``: a reader thread reads the missing layers in forward order, at most
  ``lookahead`` layers ahead of the one running, while the resident prefix and the layers
  already read run; a layer's forward pre-hook waits until its layer is in (Ignite's
  pipelined loading; the bound keeps a cold model from flooding the budget).

``in_place`` layers are never read ahead: their forward pass reads the few pages it needs
from the mapping (an embedding lookup touches 128 of BERT's 30,522 rows), the CPU analog of
Ignite's direct host access. Which layers are missing is measured with ``mincore`` when the
request starts.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from packrat.runtime.layerfile import LayerFile, RateLimiter

__all__ = ["MODES", "LayeredModel", "Mode", "RunStats", "embedding_layers", "layer_times"]

Mode = Literal["load", "demand", "prefetch"]
MODES: tuple[Mode, ...] = ("load", "demand", "prefetch")


@dataclass(slots=True)
class RunStats:
    """One request: wall time, what was read, how long compute waited for reads."""

    wall_s: float = 0.0
    read_bytes: int = 0
    read_s: float = 0.0
    stall_s: float = 0.0
    missing_layers: int = 0


def embedding_layers(model: nn.Module, lf: LayerFile) -> frozenset[int]:
    """The layers that are embedding tables (read in place, never prefetched)."""
    return frozenset(
        i
        for i, la in enumerate(lf.layers)
        if isinstance(model.get_submodule(la.name), nn.Embedding)
    )


@dataclass(slots=True)
class _Run:
    mode: Mode
    missing: list[bool]
    ready: list[threading.Event]
    lookahead: int
    running: int = -1
    done: list[int] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    stats: RunStats = field(default_factory=RunStats)
    error: BaseException | None = None


class LayeredModel:
    """A mapped model whose forward pass brings missing layers in by ``mode``.

    One request at a time per instance (the caller serialises): the hooks consult the run
    in progress."""

    def __init__(
        self,
        model: nn.Module,
        lf: LayerFile,
        limiter: RateLimiter | None = None,
        *,
        in_place: Iterable[int] = (),
    ) -> None:
        self.model, self.lf, self.limiter = model, lf, limiter
        self.in_place = frozenset(in_place)
        self._run: _Run | None = None
        self._lock = threading.Lock()
        for i, la in enumerate(lf.layers):
            unit = model.get_submodule(la.name)
            unit.register_forward_pre_hook(lambda _m, _a, i=i: self._gate(i))

    def missing(self) -> list[bool]:
        """Per layer: not entirely in the page cache now (in-place layers never count)."""
        return [
            i not in self.in_place and self.lf.resident(i) < la.length
            for i, la in enumerate(self.lf.layers)
        ]

    def _read(self, run: _Run, i: int) -> None:
        start = time.perf_counter()
        run.stats.read_bytes += self.lf.read_layer(i, self.limiter)
        run.stats.read_s += time.perf_counter() - start

    def _gate(self, i: int) -> None:
        run = self._run
        if run is None:
            return
        if run.mode == "prefetch":
            with run.cond:  # layer i starts: a slot ahead of it frees up
                run.running = i
                run.cond.notify_all()
        if not run.missing[i]:
            return
        if run.mode == "demand":
            self._read(run, i)
            return
        if run.mode == "prefetch":
            start = time.perf_counter()
            run.ready[i].wait()
            run.stats.stall_s += time.perf_counter() - start
            if run.error is not None:
                raise RuntimeError(f"reading layer {i} failed: {run.error}")

    def _reader(self, run: _Run) -> None:
        try:
            for i, need in enumerate(run.missing):
                if not need:
                    continue
                with run.cond:  # bounded: at most `lookahead` layers read and not yet started
                    run.cond.wait_for(
                        lambda: sum(j > run.running for j in run.done) < run.lookahead
                    )
                self._read(run, i)
                with run.cond:
                    run.done.append(i)
                run.ready[i].set()
        except BaseException as exc:  # surfaced on the compute thread by the gate
            run.error = exc
            for event in run.ready:
                event.set()

    def __call__(
        self, x: Tensor | tuple[Tensor, ...], mode: Mode, lookahead: int = 1
    ) -> tuple[Tensor, RunStats]:
        """Run one request; returns the output and what it cost."""
        with self._lock:
            start = time.perf_counter()
            missing = self.missing()
            run = _Run(mode, missing, [threading.Event() for _ in missing], max(1, lookahead))
            run.stats.missing_layers = sum(missing)
            reader = None
            if mode == "load":
                for i, need in enumerate(missing):
                    if need:
                        self._read(run, i)
                run.missing = [False] * len(missing)
            elif mode == "prefetch" and any(missing):
                reader = threading.Thread(target=self._reader, args=(run,), daemon=True)
                reader.start()
            self._run = run
            try:
                with torch.inference_mode():
                    out = self.model(*x) if isinstance(x, tuple) else self.model(x)
            finally:
                self._run = None
                if reader is not None:
                    with run.cond:
                        run.running = len(missing)  # release a reader still waiting
                        run.cond.notify_all()
                    reader.join()
            run.stats.wall_s = time.perf_counter() - start
            return out, run.stats


def layer_times(lm: LayeredModel, x: Tensor | tuple[Tensor, ...], *, reps: int = 3) -> list[float]:
    """Per-layer compute seconds of a warm pass (median of ``reps``): from a layer's forward
    pre-hook to the next one's (the last to the end of the pass), so the work between layers
    (activations, pooling) is charged to the layer before it."""
    n = len(lm.lf.layers)
    samples: list[list[float]] = [[] for _ in range(n)]
    marks: list[tuple[int, float]] = []
    handles = [
        lm.model.get_submodule(la.name).register_forward_pre_hook(
            lambda _m, _a, i=i: marks.append((i, time.perf_counter()))
        )
        for i, la in enumerate(lm.lf.layers)
    ]
    try:
        lm(x, "load")  # warm: everything read in
        for _ in range(max(1, reps)):
            marks.clear()
            with torch.inference_mode():
                lm.model(*x) if isinstance(x, tuple) else lm.model(x)
            marks.append((n, time.perf_counter()))
            for (i, t0), (_, t1) in itertools.pairwise(marks):
                samples[i].append(t1 - t0)
    finally:
        for h in handles:
            h.remove()
    return [sorted(s)[len(s) // 2] if s else 0.0 for s in samples]
