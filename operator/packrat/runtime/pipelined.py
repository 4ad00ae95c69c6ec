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
- ``prefetch``: a reader thread reads the missing layers in forward order while the resident
  prefix and the layers already read run; a layer's forward pre-hook waits until its layer
  is in (Ignite's pipelined loading). The reader runs at most ``read_ahead_bytes`` ahead
  (the bytes read and not yet started, with the next layer's; always at least one layer):
  a window in bytes, not in layers, so that small early layers (ResNet-50's stem and first
  two stages hold 6% of its weights and about 45% of its multiply-adds) do not hold the
  reader back while they run. The pool makes room for the whole model before the request
  (:mod:`packrat.serve.pool.residency`), so the window never takes memory beyond it; it
  bounds what a slow compute leaves read and unused.

The reader can be pinned to its own cores (``reader_cpus``: on Linux
``sched_setaffinity(0, ...)`` in a thread applies to that thread alone), so that on a pod
with a core the compute does not use, the reads' CPU work (the kernel's page-cache work
done in the reader's context) does not land on the compute's core.

``in_place`` layers are never read ahead: their forward pass reads the few pages it needs
from the mapping (an embedding lookup touches 128 of BERT's 30,522 rows), the CPU analog of
Ignite's direct host access. For an embedding, the rows its input names are asked for all
at once just before the lookup (:meth:`~packrat.runtime.layerfile.LayerFile.prefetch_rows`),
so its page faults wait for concurrent reads rather than for one read each. Which layers are
missing is measured with ``mincore`` when the request starts.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from packrat.runtime.layerfile import LayerFile, RateLimiter

__all__ = [
    "MODES",
    "READ_AHEAD_BYTES",
    "LayeredModel",
    "Mode",
    "RunStats",
    "embedding_layers",
    "layer_times",
]

Mode = Literal["load", "demand", "prefetch"]
MODES: tuple[Mode, ...] = ("load", "demand", "prefetch")
READ_AHEAD_BYTES = 64 << 20
"""The reader's default window: about two thirds of ResNet-50, two BERT-base encoder layers."""


@dataclass(slots=True)
class RunStats:
    """One request: wall time, what was read, how long compute waited for reads."""

    wall_s: float = 0.0
    """Seconds of the whole request, from the page-cache check to its output, reads
    included."""
    read_bytes: int = 0
    """Bytes of whole layers read from the layer file for this request."""
    read_s: float = 0.0
    """Seconds spent reading layers, summed over the reads (in ``prefetch`` mode on the
    reader thread, while compute runs)."""
    stall_s: float = 0.0
    """Seconds compute waited for a layer still being read (``prefetch`` mode only)."""
    missing_layers: int = 0
    """Layers not entirely in the page cache when the request began (in-place layers never
    count)."""
    row_bytes: int = 0
    """Bytes of in-place embedding rows asked for ahead of their lookups."""


def embedding_layers(model: nn.Module, lf: LayerFile) -> frozenset[int]:
    """The layers that are embedding tables (read in place, never prefetched)."""
    return frozenset(
        i
        for i, la in enumerate(lf.layers)
        if all(isinstance(model.get_submodule(m), nn.Embedding) for m in la.modules or [la.name])
    )


@dataclass(slots=True)
class _Run:
    mode: Mode
    missing: list[bool]
    ready: list[threading.Event]
    window: int
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
        read_ahead_bytes: int = READ_AHEAD_BYTES,
        reader_cpus: Iterable[int] | None = None,
    ) -> None:
        self.model, self.lf, self.limiter = model, lf, limiter
        self.in_place = frozenset(in_place)
        self.read_ahead_bytes = read_ahead_bytes
        self.reader_cpus = frozenset(reader_cpus) if reader_cpus else None
        self.prefetch_rows = True  # in-place embeddings ask for their rows ahead (benchmarks: off)
        self._run: _Run | None = None
        self._lock = threading.Lock()
        for i, la in enumerate(lf.layers):
            unit = model.get_submodule(la.name)
            unit.register_forward_pre_hook(lambda _m, _a, i=i: self._gate(i))
            if isinstance(unit, nn.Embedding):
                unit.register_forward_pre_hook(lambda _m, args, i=i: self._rows(i, args))

    def _rows(self, i: int, args: tuple[object, ...]) -> None:
        """An in-place embedding is about to look up ``args[0]``: queue those rows' reads."""
        if self._run is None or i not in self.in_place or not self.prefetch_rows or not args:
            return
        if not isinstance(args[0], Tensor):
            return
        ids = args[0]
        if ids.is_floating_point() or ids.numel() == 0:
            return
        self._run.stats.row_bytes += self.lf.prefetch_rows(i, torch.unique(ids).tolist())

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

    def _ahead(self, run: _Run) -> int:
        """Bytes read and not yet started (under ``run.cond``)."""
        return sum(self.lf.layers[j].length for j in run.done if j > run.running)

    def _reader(self, run: _Run) -> None:
        if self.reader_cpus:  # this thread only; best effort (a cpuset may forbid it)
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.reader_cpus)
        try:
            for i, need in enumerate(run.missing):
                if not need:
                    continue
                size = self.lf.layers[i].length

                def room(size: int = size) -> bool:  # the window, or nothing ahead
                    ahead = self._ahead(run)
                    return ahead == 0 or ahead + size <= run.window

                with run.cond:
                    run.cond.wait_for(room)
                self._read(run, i)
                with run.cond:
                    run.done.append(i)
                run.ready[i].set()
        except BaseException as exc:  # surfaced on the compute thread by the gate
            run.error = exc
            for event in run.ready:
                event.set()

    def __call__(
        self, x: Tensor | tuple[Tensor, ...], mode: Mode, read_ahead_bytes: int | None = None
    ) -> tuple[Tensor, RunStats]:
        """Run one request; returns the output and what it cost (``read_ahead_bytes``: this
        request's window instead of the model's)."""
        window = self.read_ahead_bytes if read_ahead_bytes is None else read_ahead_bytes
        with self._lock:
            start = time.perf_counter()
            missing = self.missing()
            run = _Run(mode, missing, [threading.Event() for _ in missing], max(0, window))
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
