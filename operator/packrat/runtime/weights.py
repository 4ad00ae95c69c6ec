"""One copy of the weights per pod: a state dict saved once, memory-mapped by every instance.

This is the CPU analog of Ignite's direct host access. The pod writes the model's state
dict once (:func:`export`, ``torch.save``'s zip format, whose tensor records are 64-byte
aligned); every worker then builds the architecture with ``torch.nn.init`` switched off, so
its tensors are allocated but never written (untouched pages cost no memory), and assigns
tensors that ``torch.load(mmap=True)`` maps straight from that file (:func:`load_shared`),
which frees the unwritten ones. Not the ``meta`` device: its first use imports
``torch._dynamo``, sympy and ``torch.distributed`` (about 800 modules, 65 MB and seconds per
worker, measured on ResNet-50). The mapping is private copy-on-write, and inference
never writes a weight, so every worker reads the same page-cache pages: N instances hold
one copy of the weights between them, not N, and an instance starts without copying a
byte. Pages are faulted in on first use, so the warm-up pass that touches every layer
once is also the load, layer by layer, overlapped with execution.

TorchScript files are loaded as usual (TorchScript cannot be built on ``meta``) and their
parameters and buffers then swapped for the mapped ones, which frees the private copies.
What cannot be shared stays per worker: activations, per-thread buffers, the runtime.

Also a command, so that the pod's dispatcher process never holds the model:
``python -m packrat.runtime.weights MODEL OUT``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from packrat.runtime import modelid, zoo

__all__ = [
    "MappedBytes",
    "WeightsError",
    "build_frozen",
    "export",
    "export_mapped",
    "load_shared",
    "mapped_bytes",
    "save",
    "weights_path",
]

SUFFIX = modelid.WEIGHTS_SUFFIX


class WeightsError(RuntimeError):
    """The weight file is missing, unreadable or does not match the model."""


def weights_path(directory: Path, spec: str) -> Path:
    """Where the pod keeps ``spec``'s weights: named by the model digest, so never stale."""
    return directory / modelid.weights_file_name(spec, zoo.model_digest(spec))


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every persistent parameter and buffer, as plain tensors."""
    return {name: t.detach() for name, t in model.state_dict(keep_vars=True).items()}


def export(spec: str, path: Path) -> Path:
    """Save ``spec``'s weights to ``path`` atomically (a reader never sees half a file)."""
    _save(zoo.load_model(spec), path)
    return path


def export_mapped(spec: str, path: Path) -> nn.Module:
    """Save ``spec``'s weights to ``path`` and return the model with every tensor then mapped
    from it, like :func:`load_shared` (one build, where export then load builds it twice)."""
    model = zoo.load_model(spec)
    _save(model, path)
    _swap_in(model, _read(path), path)
    return _frozen(model)


def build_frozen(spec: str) -> nn.Module:
    """``spec``'s model as :func:`load_shared` returns it (eval mode, no grad), its tensors
    in this process's memory: for a process whose forks share them (the native runtime's
    zygote), which saves them later with :func:`save`."""
    return _frozen(zoo.load_model(spec))


def save(model: nn.Module, path: Path) -> Path:
    """Save ``model``'s weights to ``path`` atomically, as :func:`export` does."""
    _save(model, path)
    return path


def _frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


STALE_TMP_SECONDS = 600.0
"""A temporary weight file not written to for this long was left by a killed writer; the
next save removes it, so crashes cannot fill the volume. A writer holds an exclusive lock
(``flock``) on its file while it writes: a file whose lock is free has no live writer and is
removed at once (issue 38: a container killed every few seconds left one model-sized file
each time); the age is the fallback where locks are not kept."""


def _remove_stale(path: Path, now: float) -> None:
    for tmp in path.parent.glob(f"{path.name}*.tmp"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if _unlocked(tmp) or now - tmp.stat().st_mtime > STALE_TMP_SECONDS:
                tmp.unlink()


def _unlocked(path: Path) -> bool:
    """Whether no process holds ``path``'s lock (its writer is gone)."""
    with path.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def _save(model: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path, time.time())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process writes (see _remove_stale)
        with _no_crc32():
            torch.save(_tensors(model), tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def _no_crc32() -> Iterator[None]:
    """``torch.save`` without the zip records' CRC-32: it was 60% of writing ResNet-50's
    weights (0.15-0.26 s against 0.06-0.08 s), on the pod's start path, for a file the pod
    writes and maps itself (atomically: a reader never sees half a file)."""
    serialization = torch.serialization
    get = getattr(serialization, "get_crc32_options", None)
    if get is None:  # an older torch: it always computes them
        yield
        return
    before = get()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(before)


def _read(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, ValueError) as exc:
        raise WeightsError(f"{path}: cannot map the weight file: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise WeightsError(f"{path}: not a state dict of tensors")
    return state


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers do nothing (modules look them up at call
    time), so a model built inside allocates its tensors without writing them."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved: dict[str, Callable[..., object]] = {n: getattr(nn.init, n) for n in names}

    def skip(tensor: Tensor, *_args: object, **_kwargs: object) -> Tensor:
        return tensor

    for name in names:
        setattr(nn.init, name, skip)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def load_shared(spec: str, path: Path) -> nn.Module:
    """``spec``'s model (eval mode, no grad) whose weights are mapped read-only from ``path``."""
    state = _read(path)
    if zoo.is_zoo_name(spec):
        with _no_init():
            model = zoo.load_model(spec)
        try:
            model.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            raise WeightsError(f"{path}: does not match {spec}: {exc}") from None
    else:
        model = zoo.load_model(spec)
        _swap_in(model, state, path)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _named_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _swap_in(model: nn.Module, state: dict[str, Tensor], path: Path) -> None:
    """Point a loaded (TorchScript) module's tensors at the mapped ones, in place."""
    own = dict(model.state_dict(keep_vars=True))
    if set(own) != set(state):
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise WeightsError(
            f"{path}: does not match the model (missing {missing[:5]}, unexpected {extra[:5]})"
        )
    with torch.no_grad():
        for name, tensor in own.items():
            mapped = state[name]
            if mapped.shape != tensor.shape or mapped.dtype != tensor.dtype:
                raise WeightsError(
                    f"{path}: {name} is {mapped.shape}/{mapped.dtype}, "
                    f"the model has {tensor.shape}/{tensor.dtype}"
                )
            tensor.set_(mapped)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class MappedBytes:
    """How much of a model's tensor data lives inside a mapping of one file."""

    mapped: int
    total: int

    @property
    def fraction(self) -> float:
        return self.mapped / self.total if self.total else 1.0


def _file_ranges(path: Path, maps: str) -> list[tuple[int, int]]:
    target = os.path.realpath(path)
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and os.path.realpath(parts[5].strip()) == target:
            lo, hi = parts[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def mapped_bytes(model: nn.Module, path: Path, *, maps: str | None = None) -> MappedBytes:
    """Bytes of ``model``'s tensors that lie in this process's mappings of ``path``."""
    if maps is None:
        maps = Path("/proc/self/maps").read_text()
    ranges = _file_ranges(path, maps)
    seen: set[int] = set()
    mapped = total = 0
    for _, t in _named_tensors(model):
        storage = t.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        if ptr in seen or size == 0:
            continue
        seen.add(ptr)
        total += size
        if any(lo <= ptr and ptr + size <= hi for lo, hi in ranges):
            mapped += size
    return MappedBytes(mapped=mapped, total=total)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m packrat.runtime.weights",
        description="Save a model's weights once, for every instance of a pod to map.",
    )
    parser.add_argument("model", help="zoo name or TorchScript file")
    parser.add_argument("out", type=Path, help="weight file to write (atomically)")
    args = parser.parse_args(argv)
    try:
        export(args.model, args.out)
    except (zoo.ZooError, OSError) as exc:
        print(f"packrat weights: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
