"""Layer-wise weights on disk, mapped: a layer can be read, prefetched or dropped as a unit.

Ignite keeps a *prefix* of each model's layers in fast memory and loads the rest in forward
order while the prefix runs. On CPU the fast memory is the pod's RAM (the page cache of a
mapped weight file) and the slow tier is the node's disk. For that to work per layer, each
layer's tensors must be contiguous and aligned in the file, so that reading a layer is one
sequential read, dropping it frees exactly its pages (see :data:`LAYER_ALIGN`), and asking
the kernel which of its pages are resident (``mincore``) answers for that layer alone.
``torch.save``'s zip orders records by key, not by execution, and aligns them to 64 bytes,
so this module writes its own layout:

    b"PKRLAYR1" | u64 header length | JSON header | hole to 2 MiB | layer 0 | hole | layer 1 ...

The header lists, per layer (in the order the forward pass first uses it, recorded with
hooks on one example input), its modules, its offset and length in the file and its tensors
(key, dtype, shape, offset within the layer, 64-byte aligned). **Layout 2** (``"layout": 2``
in the header): a layer is a run of consecutive modules in forward order, at least
:data:`MIN_LAYER_BYTES` together, where a module is one that holds tensors of its own (a
module without any of its own is opened into its children, so a ResNet bottleneck is its
convolutions and norms, a BERT encoder layer its projections and norms); an embedding table
is a layer of its own (read in place, never prefetched). ResNet-50: 33 layers, BERT-base:
76. Finer layers let a cold start begin computing after a few MiB instead of a whole
encoder layer (28 MB), and end sooner after the last byte; grouping small modules keeps
each read large (a 4 KiB norm read alone costs an I/O round trip). Layout 1 (no ``layout``
key: the root's children, ``nn.Sequential``/``nn.ModuleList`` opened, one module per layer)
is still read; the pool rewrites such files once at start (:func:`upgrade_layer_file`).

Eviction really drops the pages: ``madvise(MADV_DONTNEED)`` on the layer's part of the
mapping (this process's page-table entries) and ``posix_fadvise(POSIX_FADV_DONTNEED)`` on
the file range (the page cache; clean pages are freed at once, unless another process maps
them). :meth:`LayerFile.resident` measures what is left with ``mincore`` (ctypes), which for
a file mapping reports the page cache, so it is measured, not assumed.

Reading goes through :meth:`LayerFile.read_layer`: a whole layer populated into the mapping
in one call that releases the GIL (``MADV_POPULATE_READ``; ``pread`` on older kernels),
optionally through a
shared :class:`RateLimiter` standing in for a network volume slower than the local disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import itertools
import json
import math
import mmap
import os
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = [
    "LayerFile",
    "LayerFileError",
    "LayerInfo",
    "RateLimiter",
    "build_mapped",
    "forward_units",
    "group_units",
    "measure_read_rate",
    "upgrade_layer_file",
    "write_layer_file",
]

MAGIC = b"PKRLAYR1"
LAYOUT = 2
MIN_LAYER_BYTES = 1 << 20
PAGE = mmap.PAGESIZE
LAYER_ALIGN = 2 << 20
MAX_ROW_RUNS = 4096
"""At most this many runs of pages queued per embedding lookup (a bound on the syscalls)."""
"""Layers start on 2 MiB boundaries: the page cache holds file data in folios of up to 2 MiB
(large folios, ext4 on Linux 6.x), naturally aligned, and ``POSIX_FADV_DONTNEED`` skips a folio
that reaches outside the range given, so a layer sharing a folio with its neighbour could not
be dropped alone (measured: 18.7 of ResNet-50's 102.5 MB stayed resident with page-aligned
layers). The gaps are holes: never written, never read, no disk space."""
TENSOR_ALIGN = 64
CHUNK = 1 << 20
MIN_WINDOW = 128 << 10  # the kernel's default read_ahead_kb


def readahead_window(fd: int) -> int:
    """The most one ``POSIX_FADV_WILLNEED`` call reads ahead on ``fd``'s device: the larger
    of ``read_ahead_kb`` and ``max_sectors_kb`` (the kernel caps the call there; past it a
    populate faults the rest one 4 KiB page at a time, synchronously, the mapping being
    ``MADV_RANDOM``: measured 1 MB/s under load for a 64 MiB range asked at once). 128 KiB,
    the kernel's default, where sysfs does not say (a partition's parent is tried)."""
    dev = os.fstat(fd).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (base / "queue", base / ".." / "queue"):
        try:
            kb = max(
                int((queue / name).read_text()) for name in ("read_ahead_kb", "max_sectors_kb")
            )
        except (OSError, ValueError):
            continue
        return max(MIN_WINDOW, min(kb << 10, 64 << 20))
    return MIN_WINDOW


MAX_HEADER = 2 << 20
"""A header of at most 2 MiB (BERT-base's is 20 KB): parsing one costs about 18 bytes of
Python objects per header byte (a 16 MiB header of one-element tensors took 259 MiB)."""
MAX_DIMS = 16
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        *("float64", "float32", "float16", "bfloat16", "complex64", "complex128"),
        *("int64", "int32", "int16", "int8", "uint8", "bool"),
        *("float8_e4m3fn", "float8_e5m2"),
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}
"""The dtypes a layer file's tensor may have (by their names in the header)."""
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python lacks the name


class LayerFileError(RuntimeError):
    """The layer file is missing, malformed or does not match the model."""


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _has_own_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def _units(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    """The modules holding tensors of their own (each with its subtree), depth first: a
    module without tensors of its own is opened into its children."""
    for name, child in module.named_children():
        full = f"{prefix}{name}"
        if _has_own_tensors(child):
            yield full, child
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            yield from _units(child, f"{full}.")


def forward_units(model: nn.Module, example: Tensor | tuple[Tensor, ...]) -> list[str]:
    """The model's modules holding tensors (see :func:`_units`), in the order one forward
    pass first calls them."""
    if _has_own_tensors(model):
        raise LayerFileError("the root module holds tensors of its own; not layer-wise")
    units = dict(_units(model, ""))
    order: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda _m, _a, name=name: order.append(name))
        for name, module in units.items()
    ]
    try:
        with torch.inference_mode():
            model(*example) if isinstance(example, tuple) else model(example)
    finally:
        for h in handles:
            h.remove()
    seen = list(dict.fromkeys(order))
    missing = [n for n in units if n not in seen]
    return seen + missing  # never called on this input: last, still in the file


def group_units(
    units: Sequence[str], sizes: Sequence[int], alone: Sequence[bool], min_bytes: int
) -> list[list[str]]:
    """Consecutive units in layers of at least ``min_bytes`` (the last may be smaller); a
    unit marked ``alone`` (an embedding table) is a layer by itself."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for unit, nbytes, single in zip(units, sizes, alone, strict=True):
        if single:
            if current:
                groups.append(current)
            groups.append([unit])
            current, size = [], 0
            continue
        current.append(unit)
        size += nbytes
        if size >= min_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a layer, as the header lists it (``[key, dtype, shape, offset, nbytes]``):
    where its bytes lie and how to view them."""

    key: str
    """Its ``state_dict`` key."""
    dtype: str
    """The torch dtype's name without ``torch.`` (``float32``)."""
    shape: tuple[int, ...]
    offset: int
    """Bytes from the start of its layer (aligned to :data:`TENSOR_ALIGN`)."""
    nbytes: int
    """Its size in bytes, stored contiguously in row-major order."""


@dataclass(frozen=True, slots=True)
class LayerInfo:
    name: str
    """The layer's first module in forward order: a forward pre-hook on it gates the layer."""
    offset: int
    """Where the layer starts in the file, in bytes (a multiple of :data:`LAYER_ALIGN`)."""
    length: int
    """The layer's bytes: its tensors, rounded up to whole pages (one read, one eviction)."""
    tensors: tuple[TensorInfo, ...]
    """Its tensors, in the order they lie in it."""
    modules: tuple[str, ...] = ()
    """Every module whose tensors the layer holds (layout 1: just ``name``)."""


def _owned(state: dict[str, Tensor], module: str) -> list[str]:
    return [k for k in state if k.startswith(module + ".")]


def _layout(
    state: dict[str, Tensor], groups: Sequence[Sequence[str]], start: int
) -> list[LayerInfo]:
    layers, offset = [], start
    for group in groups:
        keys = [k for module in group for k in _owned(state, module)]
        tensors, inner = [], 0
        for key in keys:
            t = state[key]
            nbytes = t.numel() * t.element_size()
            dtype = str(t.dtype).removeprefix("torch.")
            tensors.append(TensorInfo(key, dtype, tuple(t.shape), inner, nbytes))
            inner = _align(inner + nbytes, TENSOR_ALIGN)
        layers.append(
            LayerInfo(group[0], offset, _align(inner, PAGE), tuple(tensors), tuple(group))
        )
        offset += _align(inner, LAYER_ALIGN)
    placed = {t.key for layer in layers for t in layer.tensors}
    if placed != set(state):
        raise LayerFileError(f"tensors outside any layer: {sorted(set(state) - placed)[:5]}")
    return layers


def _header(spec: str, layers: Sequence[LayerInfo]) -> bytes:
    doc = {
        "layout": LAYOUT,
        "spec": spec,
        "layers": [
            {
                "name": la.name,
                "modules": list(la.modules),
                "offset": la.offset,
                "length": la.length,
                "tensors": [
                    [t.key, t.dtype, list(t.shape), t.offset, t.nbytes] for t in la.tensors
                ],
            }
            for la in layers
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def write_layer_file(
    model: nn.Module,
    path: Path,
    *,
    spec: str,
    example: Tensor | tuple[Tensor, ...],
    min_layer_bytes: int = MIN_LAYER_BYTES,
    group_key: Callable[[str], str] | None = None,
) -> Path:
    """Write ``model``'s weights to ``path`` layer by layer (atomically), in layers of at
    least ``min_layer_bytes`` (0: one module per layer; see the module's doc), or, with
    ``group_key``, consecutive modules with the same key as one layer (a benchmark's coarser
    split: one layer per ResNet bottleneck or BERT encoder layer, as layout 1 had)."""
    units = forward_units(model, example)
    state = {k: t.detach().contiguous() for k, t in model.state_dict().items()}
    if group_key is not None:
        groups = [list(g) for _, g in itertools.groupby(units, key=group_key)]
    else:
        sizes = [sum(state[k].nbytes for k in _owned(state, u)) for u in units]
        alone = [isinstance(model.get_submodule(u), nn.Embedding) for u in units]
        groups = group_units(units, sizes, alone, min_layer_bytes)
    # The header's length depends on the offsets it lists; two passes settle it.
    layers = _layout(state, groups, 0)
    start = _align(16 + len(_header(spec, layers)) + 64, LAYER_ALIGN)
    layers = _layout(state, groups, start)
    header = _header(spec, layers)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for layer in layers:
                for t in layer.tensors:
                    out.seek(layer.offset + t.offset)
                    out.write(state[t.key].reshape(-1).view(torch.uint8).numpy().tobytes())
            end = layers[-1].offset + layers[-1].length if layers else start
            out.truncate(end)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class RateLimiter:
    """At most ``bytes_per_s`` through every reader that shares it (a network volume's rate);
    ``None`` for no limit. Thread-safe: readers queue for the bandwidth, first come first."""

    def __init__(
        self,
        bytes_per_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise ValueError("the read rate must be > 0 bytes/s")
        self.bytes_per_s = bytes_per_s
        self._clock, self._sleep = clock, sleep
        self._free_at = 0.0
        self._lock = threading.Lock()

    def wait(self, nbytes: int) -> None:
        """Block until ``nbytes`` more fit the rate (call after reading them)."""
        if self.bytes_per_s is None:
            return
        with self._lock:
            now = self._clock()
            self._free_at = max(self._free_at, now - nbytes / self.bytes_per_s)
            self._free_at += nbytes / self.bytes_per_s
            until = self._free_at
        delay = until - self._clock()
        if delay > 0:
            self._sleep(delay)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mincore.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


def _madvise(address: int, length: int, advice: int) -> None:
    """``madvise`` through ctypes, which lets go of the GIL for the call (``mmap.madvise``
    holds it, and ``MADV_POPULATE_READ`` waits for the disk: the compute thread, which needs
    the GIL between operators, would wait with it)."""
    if _libc.madvise(ctypes.c_void_p(address), length, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _parse_header(raw: bytes, path: Path) -> tuple[str, list[LayerInfo], int]:
    """(spec, layers, layout): a header without ``layout`` is layout 1 (one module a layer).
    Whatever the bytes are, :class:`LayerFileError` is all it raises."""
    try:
        doc = json.loads(raw)
        layers = [
            LayerInfo(
                str(la["name"]),
                int(la["offset"]),
                int(la["length"]),
                tuple(
                    TensorInfo(str(k), str(d), tuple(s), int(o), int(n))
                    for k, d, s, o, n in la["tensors"]
                ),
                tuple(str(m) for m in la.get("modules", [la["name"]])),
            )
            for la in doc["layers"]
        ]
        return str(doc["spec"]), layers, int(doc.get("layout", 1))
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        raise LayerFileError(f"{path}: malformed layer file header: {exc}") from None
    except RecursionError:
        raise LayerFileError(f"{path}: malformed layer file header: nested too deeply") from None


def _check_tensors(la: LayerInfo, keys: set[str]) -> str | None:
    """What is wrong with ``la``'s tensors (None: nothing): each a known dtype, its bytes
    exactly its shape's, aligned, inside its layer, after the one before it, its key new."""
    inner = 0
    for t in la.tensors:
        dtype = DTYPES.get(t.dtype)
        if dtype is None:
            return f"tensor {t.key[:80]!r} has dtype {t.dtype[:40]!r}, not one of {sorted(DTYPES)}"
        if len(t.shape) > MAX_DIMS or not all(type(d) is int and d >= 0 for d in t.shape):
            return f"tensor {t.key[:80]!r} has shape {list(t.shape)[: MAX_DIMS + 1]}"
        if math.prod(t.shape) * dtype.itemsize != t.nbytes:
            return f"tensor {t.key[:80]!r}: {t.nbytes} bytes is not its shape's"
        if t.offset < inner or t.offset % TENSOR_ALIGN or t.offset + t.nbytes > la.length:
            return f"tensor {t.key[:80]!r} at {t.offset} overlaps another or leaves its layer"
        if t.key in keys:
            return f"tensor {t.key[:80]!r} appears twice"
        keys.add(t.key)
        inner = t.offset + t.nbytes
    return None


def _check_layers(layers: Sequence[LayerInfo], start: int, size: int, path: Path) -> None:
    """Every layer inside the file's ``[start, size)`` (past the header), page-aligned, in
    file order and disjoint, its tensors as :func:`_check_tensors` says; or
    :class:`LayerFileError`. Nothing else is mapped, advised or counted with ``mincore``:
    a layer outside the mapping would have ``madvise(MADV_DONTNEED)`` drop whatever memory
    lay there, and a length that is not whole pages overran ``mincore``'s vector."""
    keys: set[str] = set()
    end = start
    for la in layers:
        where = f"{path}: layer {la.name[:80]!r}"
        if la.offset < end or la.offset % PAGE or la.length < 0 or la.length % PAGE:
            raise LayerFileError(
                f"{where} at {la.offset} (+{la.length} bytes): not whole pages past the header "
                "and the layer before it"
            )
        if la.offset + la.length > size:
            end = max(x.offset + x.length for x in layers)
            raise LayerFileError(f"{path}: truncated ({size} bytes, layers end at {end})")
        if (problem := _check_tensors(la, keys)) is not None:
            raise LayerFileError(f"{where}: {problem}")
        end = la.offset + la.length


class LayerFile:
    """One layer file, mapped read-only; per-layer read, evict and residency."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:  # O_NONBLOCK: a FIFO in its place would block the open for ever
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise LayerFileError(f"{path}: cannot open: {exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise LayerFileError(f"{path}: not a regular file")
            self.spec, self.layers, self.layout = self._read_header()
            size = os.fstat(self._fd).st_size
            _check_layers(self.layers, self._header_end, size, path)
            self.end = max((la.offset + la.length for la in self.layers), default=0)
            self._map = mmap.mmap(self._fd, size, prot=mmap.PROT_READ)
            # Faults read only the pages touched: a layer read in place (an embedding lookup)
            # reads its rows, and nothing reads a neighbouring layer behind the policy's back.
            self._map.madvise(mmap.MADV_RANDOM)
        except BaseException:
            os.close(self._fd)
            raise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": never written
            self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._base = self._bytes.data_ptr()
        self.index = {la.name: i for i, la in enumerate(self.layers)}
        self._buffer = bytearray(CHUNK)
        self._can_populate = True
        self._window = readahead_window(self._fd)

    def _read_header(self) -> tuple[str, list[LayerInfo], int]:
        head = os.pread(self._fd, 16, 0)
        if len(head) != 16 or head[:8] != MAGIC:
            raise LayerFileError(f"{self.path}: not a packrat layer file")
        (length,) = struct.unpack("<Q", head[8:])
        if length > MAX_HEADER:
            raise LayerFileError(f"{self.path}: header of {length} bytes is too large")
        self._header_end = 16 + length
        return _parse_header(os.pread(self._fd, length, 16), self.path)

    def intact(self) -> bool:
        """The file still holds every layer's bytes (one ``fstat``). A mapping whose file was
        truncated under it raises SIGBUS, which kills the process, on the first touch of a
        page past the new end: check before a pass touches it."""
        return os.fstat(self._fd).st_size >= self.end

    @property
    def total_bytes(self) -> int:
        return sum(la.length for la in self.layers)

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor, as a view of the mapping (nothing is read until it is used)."""
        out = {}
        for la in self.layers:
            for t in la.tensors:
                start = la.offset + t.offset
                raw = self._bytes[start : start + t.nbytes]
                out[t.key] = raw.view(getattr(torch, t.dtype)).view(t.shape)
        return out

    def read_layer(self, i: int, limiter: RateLimiter | None = None) -> int:
        """Bring layer ``i`` into the page cache (and this mapping); returns bytes read.

        The whole layer in one call that lets go of the GIL: ``POSIX_FADV_WILLNEED`` queues
        its reads (in pieces of :func:`readahead_window`, the most one call starts), then one
        ``MADV_POPULATE_READ`` (Linux 5.14) waits for them and maps the pages without copying
        a byte to user space (measured on BERT-base: 0.01-0.02 s of CPU against 0.04-0.19 s
        for ``pread`` into a buffer, CPU that a cold start's compute, running beside the
        reader, needs). Reading in 1 MiB chunks took the GIL back 28 times per BERT layer;
        now 5 times (reading BERT alone measured 0.57 -> 0.31 s). The compute still
        runs 1.2-2.5x slower beside a read on a busy 2-core machine, but a reader in another
        process slows it as much: that is the machine, not the GIL (docs/measurements.md,
        many models in one pool). A rate limit is
        charged per layer, after it is read: the layer counts as in when its last byte would
        have arrived. Older kernels fall back to ``pread`` in 1 MiB chunks."""
        la = self.layers[i]
        self._populate(la.offset, la.length, la.name)
        if limiter is not None:
            limiter.wait(la.length)
        return la.length

    def prefetch_rows(self, i: int, rows: Sequence[int]) -> int:
        """Queue the reads of ``rows`` of layer ``i``'s table (an embedding read in place: its
        one 2-D tensor) all at once, with ``POSIX_FADV_WILLNEED`` per run of pages, and return
        the bytes asked for. The lookup that follows then finds its pages in the page cache or
        on their way, instead of faulting them in one 4 KiB page after another on the compute
        thread (BERT-base's 128 token rows: 0.033 s of faults on a cold file). Rows out of
        range are ignored (the lookup itself refuses them); at most ``MAX_ROW_RUNS`` runs."""
        la = self.layers[i]
        tables = [t for t in la.tensors if len(t.shape) == 2]
        if len(tables) != 1 or not rows:
            return 0
        (t,) = tables
        row_bytes = t.nbytes // max(1, t.shape[0])
        start = la.offset + t.offset
        runs: list[list[int]] = []
        for r in sorted({r for r in rows if 0 <= r < t.shape[0]}):
            lo = (start + r * row_bytes) // PAGE * PAGE
            hi = _align(start + (r + 1) * row_bytes, PAGE)
            if runs and lo <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], hi)
            elif len(runs) < MAX_ROW_RUNS:
                runs.append([lo, hi])
        for lo, hi in runs:
            os.posix_fadvise(self._fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)
        return sum(hi - lo for lo, hi in runs)

    def _populate(self, offset: int, n: int, name: str) -> None:
        if self._can_populate:
            try:  # exactly this range read (the mapping is MADV_RANDOM: no read-around), mapped
                step = self._window
                for start in range(offset, offset + n, step):
                    os.posix_fadvise(
                        self._fd, start, min(step, offset + n - start), os.POSIX_FADV_WILLNEED
                    )
                _madvise(self._base + offset, n, MADV_POPULATE_READ)
                return
            except OSError:  # EINVAL: a kernel without it
                self._can_populate = False
        for start in range(offset, offset + n, CHUNK):
            size = min(CHUNK, offset + n - start)
            if os.preadv(self._fd, [memoryview(self._buffer)[:size]], start) != size:
                raise LayerFileError(f"{self.path}: short read in layer {name}")

    def evict(self, i: int) -> None:
        """Drop layer ``i``'s pages: this mapping's and the page cache's. A page that another
        mapping of the file still maps (a second :class:`LayerFile` of it, a forked worker)
        stays: the kernel never drops a mapped page, so :meth:`resident` is what to trust."""
        la = self.layers[i]
        # The whole slot, holes included: fault-around maps neighbouring cached pages, and a
        # page still mapped here cannot leave the page cache.
        slot = min(_align(la.length, LAYER_ALIGN), len(self._map) - la.offset)
        _madvise(self._base + la.offset, slot, mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, la.offset, slot, os.POSIX_FADV_DONTNEED)

    def evict_all(self) -> None:
        for i in range(len(self.layers)):
            self.evict(i)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the header too

    def resident(self, i: int) -> int:
        """Bytes of layer ``i`` in the page cache now, measured with ``mincore``."""
        la = self.layers[i]
        pages = la.length // PAGE
        if pages == 0:
            return 0
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(self._base + la.offset), la.length, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return (pages - bytes(vec).count(0)) * PAGE  # Linux sets bit 0 only

    def resident_layers(self) -> list[int]:
        """Resident bytes per layer, in file order."""
        return [self.resident(i) for i in range(len(self.layers))]

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # tensors still view it: the GC unmaps it later
            self._map.close()
        os.close(self._fd)


def build_mapped(build: Callable[[], nn.Module], lf: LayerFile) -> nn.Module:
    """``build()``'s architecture with every tensor a view of ``lf``'s mapping (eval, no grad).

    ``build`` runs with ``torch.nn.init`` switched off, so its own tensors are allocated but
    never written (no memory), then replaced by the mapped ones."""
    from packrat.runtime.weights import _no_init  # one definition of "init switched off"

    with _no_init():
        model = build()
    try:
        model.load_state_dict(lf.tensors(), strict=True, assign=True)
    except RuntimeError as exc:
        raise LayerFileError(f"{lf.path}: does not match the model: {exc}") from None
    names = {n for n, _ in model.named_modules() if n}  # the layers' hooks go on these
    strays = [m for la in lf.layers for m in (la.name, *la.modules) if m not in names]
    if strays:
        raise LayerFileError(f"{lf.path}: does not match the model: no module {strays[0][:80]!r}")
    seen: set[str] = set()
    for la in lf.layers:  # one hook per layer: a name listed 100,000 times ran 100,000 hooks
        if la.name in seen:
            raise LayerFileError(f"{lf.path}: layer {la.name[:80]!r} appears twice")
        seen.add(la.name)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def upgrade_layer_file(
    build: Callable[[], nn.Module], lf: LayerFile, example: Tensor | tuple[Tensor, ...]
) -> LayerFile:
    """``lf`` itself when its layout is current; otherwise its file rewritten in the current
    layout from its own weights (read once through the mapping, atomically replaced) and
    opened anew, ``lf`` closed. The weights are the same bytes; only the layers change."""
    if lf.layout >= LAYOUT:
        return lf
    model = build_mapped(build, lf)
    write_layer_file(model, lf.path, spec=lf.spec, example=example)
    del model
    lf.close()
    return LayerFile(lf.path)


def measure_read_rate(lf: LayerFile, *, max_bytes: int = 256 << 20) -> float:
    """The disk's sequential read rate in bytes/s: evict, then time reading the first layers
    (up to ``max_bytes``) cold; they are evicted again afterwards."""
    done, start = 0, time.perf_counter()
    lf.evict_all()
    start = time.perf_counter()
    for i in range(len(lf.layers)):
        done += lf.read_layer(i)
        if done >= max_bytes:
            break
    elapsed = time.perf_counter() - start
    lf.evict_all()
    return done / elapsed if elapsed > 0 else float("inf")
