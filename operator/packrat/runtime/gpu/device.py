"""The two memories of the GPU tier and the two streams that move and use them, behind one API.

:class:`CudaDevice` -- host tensors in pinned (page-locked) memory; device tensors from
PyTorch's caching allocator; a copy stream beside the compute stream, ordered by CUDA events;
``mapped`` gives a CUDA tensor whose pointer is the pinned host memory itself (direct host
access: kernels read it over PCIe, nothing copied). Pinned memory from ``cudaHostAlloc`` is
mapped into the device's address space under unified virtual addressing, and CuPy's
``cudaHostGetDevicePointer`` gives its device address (equal to the host address on every
64-bit platform CUDA supports); the view is built through ``__cuda_array_interface__``, which
PyTorch accepts for registered host memory (the pointer's attributes name the device).

:class:`CpuDevice` -- the stand-in CI runs: "host" and "device" are both CPU tensors but
distinct storage, a fresh device buffer is filled with NaN (a stage that ran before its copy
finished gives NaN, not the right answer), the copy stream is a thread fed in order, events
are ``threading.Event`` objects. The executor, the pool and the profiler run unchanged on it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

__all__ = ["CpuDevice", "CudaDevice", "Device", "Streams", "make_device"]

StreamName = Literal["copy", "compute"]


class Streams(Protocol):
    """Two in-order streams: ``submit`` enqueues ``fn``; ``signal``/``wait`` order them."""

    def submit(self, stream: StreamName, fn: Callable[[], None]) -> None: ...
    def signal(self, stream: StreamName, event: tuple[str, int]) -> None: ...
    def wait(self, stream: StreamName, event: tuple[str, int]) -> None: ...
    def finish(self) -> None: ...


class Device(Protocol):
    name: str
    torch_device: torch.device

    def pin(self, t: Tensor) -> Tensor: ...
    def pinned_empty(self, nbytes: int) -> Tensor: ...
    def mapped(self, host: Tensor) -> Tensor: ...
    def empty_like(self, host: Tensor) -> Tensor: ...
    def to_device(self, t: Tensor) -> Tensor: ...
    def copy_into(self, dst: Tensor, src: Tensor) -> None: ...
    def streams(self) -> Streams: ...
    def time_s(self, fn: Callable[[], Any]) -> float: ...
    def synchronize(self) -> None: ...
    def allocated_bytes(self) -> int: ...


class _ThreadStreams:
    """Each stream a worker thread running its queue in order; events are threading.Events."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue[Callable[[], None] | None]] = {}
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        for name in ("copy", "compute"):
            q: queue.Queue[Callable[[], None] | None] = queue.Queue()
            self._queues[name] = q
            th = threading.Thread(target=self._work, args=(q,), name=f"stream-{name}", daemon=True)
            th.start()
            self._threads.append(th)

    def _event(self, key: tuple[str, int]) -> threading.Event:
        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def _work(self, q: queue.Queue[Callable[[], None] | None]) -> None:
        while (fn := q.get()) is not None:
            try:
                if not self._errors:
                    fn()
            except BaseException as exc:  # reported by finish(); the other stream must not hang
                self._errors.append(exc)
                with self._lock:
                    for ev in self._events.values():
                        ev.set()

    def submit(self, stream: StreamName, fn: Callable[[], None]) -> None:
        self._queues[stream].put(fn)

    def signal(self, stream: StreamName, event: tuple[str, int]) -> None:
        ev = self._event(event)
        self._queues[stream].put(ev.set)

    def wait(self, stream: StreamName, event: tuple[str, int]) -> None:
        ev = self._event(event)
        # bounded: a schedule that never signals fails loudly instead of hanging a test
        self._queues[stream].put(
            lambda: None if ev.wait(60.0) else _raise(f"timed out waiting for {event}")
        )

    def finish(self) -> None:
        for q in self._queues.values():
            q.put(None)
        for th in self._threads:
            th.join(120.0)
        if self._errors:
            raise self._errors[0]


def _raise(msg: str) -> None:
    raise TimeoutError(msg)


class CpuDevice:
    """The CI stand-in (see module doc)."""

    name = "cpu"
    torch_device = torch.device("cpu")

    def __init__(self, copy_delay_s_per_byte: float = 0.0) -> None:
        self.copy_delay_s_per_byte = copy_delay_s_per_byte  # emulate a slow link in tests

    def pin(self, t: Tensor) -> Tensor:
        return t.detach().clone()

    def pinned_empty(self, nbytes: int) -> Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def mapped(self, host: Tensor) -> Tensor:
        return host

    def empty_like(self, host: Tensor) -> Tensor:
        out = torch.empty_like(host)
        if out.is_floating_point():
            out.fill_(float("nan"))
        elif out.dtype == torch.uint8:
            out.fill_(255)  # a packed buffer: every float32/16 in it reads NaN until copied
        return out

    def to_device(self, t: Tensor) -> Tensor:
        return t.detach().clone()

    def copy_into(self, dst: Tensor, src: Tensor) -> None:
        if self.copy_delay_s_per_byte:
            time.sleep(src.numel() * src.element_size() * self.copy_delay_s_per_byte)
        dst.copy_(src)

    def streams(self) -> Streams:
        return _ThreadStreams()

    def time_s(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def synchronize(self) -> None:
        return None

    def allocated_bytes(self) -> int:
        return 0


class _CudaStreams:
    def __init__(self) -> None:
        self._s: dict[str, torch.cuda.Stream] = {
            "compute": torch.cuda.current_stream(),
            "copy": torch.cuda.Stream(),  # type: ignore[no-untyped-call]
        }
        # the copy stream writes buffers the caching allocator may have handed out after the
        # compute stream's earlier use of them: it starts behind everything enqueued so far
        self._s["copy"].wait_stream(self._s["compute"])
        self._events: dict[tuple[str, int], torch.cuda.Event] = {}

    def submit(self, stream: StreamName, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self._s[stream]):
            fn()

    def signal(self, stream: StreamName, event: tuple[str, int]) -> None:
        ev = self._events.setdefault(event, torch.cuda.Event())  # type: ignore[no-untyped-call]
        ev.record(self._s[stream])

    def wait(self, stream: StreamName, event: tuple[str, int]) -> None:
        self._s[stream].wait_event(self._events[event])  # interleave() put the signal first

    def finish(self) -> None:
        self._s["compute"].wait_stream(self._s["copy"])


class _HostView:
    """A ``__cuda_array_interface__`` over a device address (a mapped pinned host buffer)."""

    def __init__(self, ptr: int, t: Tensor) -> None:
        typestr = {
            torch.float32: "<f4",
            torch.float16: "<f2",
            torch.int64: "<i8",
            torch.int32: "<i4",
        }
        if t.dtype not in typestr:
            raise ValueError(f"no in-place view for dtype {t.dtype}")
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": typestr[t.dtype],
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


class CudaDevice:
    """Pinned host memory, device memory, a copy stream and mapped host views (see module doc)."""

    name = "cuda"

    def __init__(self, index: int = 0) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available: use CpuDevice (the CI stand-in)")
        self.torch_device = torch.device("cuda", index)
        torch.cuda.set_device(self.torch_device)

    def pin(self, t: Tensor) -> Tensor:
        return t.detach().contiguous().pin_memory()

    def pinned_empty(self, nbytes: int) -> Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def mapped(self, host: Tensor) -> Tensor:
        if not host.is_pinned():
            raise ValueError("only pinned host memory can be read in place")
        if not host.is_contiguous():
            raise ValueError("only a contiguous host tensor can be viewed in place")
        base = host.untyped_storage().data_ptr()  # the pinned allocation's start
        ptr = base
        try:  # its device address (the host address itself under unified addressing)
            import cupy  # type: ignore[import-not-found]  # optional, where DHA runs

            ptr = int(cupy.cuda.runtime.hostGetDevicePointer(base, 0))
        except Exception:  # no CuPy, or it cannot say: UVA's identity
            ptr = base
        view = torch.as_tensor(
            _HostView(ptr + host.data_ptr() - base, host), device=self.torch_device
        )
        return view

    def empty_like(self, host: Tensor) -> Tensor:
        return torch.empty(host.shape, dtype=host.dtype, device=self.torch_device)

    def to_device(self, t: Tensor) -> Tensor:
        return t.to(self.torch_device)

    def copy_into(self, dst: Tensor, src: Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def streams(self) -> Streams:
        return _CudaStreams()

    def time_s(self, fn: Callable[[], Any]) -> float:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def allocated_bytes(self) -> int:
        return int(torch.cuda.memory_allocated(self.torch_device))


def make_device(kind: str) -> Device:
    """``cpu`` (the stand-in) or ``cuda``."""
    if kind == "cpu":
        return CpuDevice()
    if kind == "cuda":
        return CudaDevice()
    raise ValueError(f"device must be cpu or cuda, got {kind!r}")
