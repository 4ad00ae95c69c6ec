"""How much a cold read slows the compute beside it (issue 39, figure "cold start: where the
remaining gap is", in the section on many models in one pool).

A layer-ordered prefetch can reach max(read, compute) only if reading does not slow the
computing. This script times a warm model's forward pass (one torch thread, every page
resident) three ways, interleaved over ``--reps``:

    alone | beside a reader thread in this process | beside a reader in another process

The reader brings a cold scratch file in the way :meth:`LayerFile.read_layer` does
(``POSIX_FADV_WILLNEED`` then one ``MADV_POPULATE_READ`` per 28 MiB, a BERT layer) and drops
it again, in a loop. A thread shares the GIL with the compute; a process shares nothing but
the machine: if both slow the compute alike, the GIL is not the cause.

    flock /tmp/packrat-bench.lock python benchmarks/pools/read_interference.py \
        --model bert-base --out benchmarks/results/pools/read_interference.json
"""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from packrat.runtime import zoo
from packrat.runtime.layerfile import (
    MADV_POPULATE_READ,
    LayerFile,
    _madvise,
    build_mapped,
    readahead_window,
    write_layer_file,
)
from packrat.runtime.pipelined import LayeredModel

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a cold start take when a model\'s layers are read while it runs?"'
    ', part "compute beside a reader"'
    " (#how-long-does-a-cold-start-take-when-a-models-layers-are-read-while-it-runs)"
)

PIECE = 28 << 20


class _Stop(Protocol):
    def is_set(self) -> bool: ...


def _reader(path: str, stop: _Stop) -> None:
    """Read ``path`` cold, 28 MiB at a time, dropping each piece again, until ``stop``."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    window = readahead_window(fd)
    view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    view.madvise(mmap.MADV_RANDOM)
    base = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    offset = 0
    while not stop.is_set():
        for start in range(offset, offset + PIECE, window):
            os.posix_fadvise(fd, start, window, os.POSIX_FADV_WILLNEED)
        _madvise(base + offset, PIECE, MADV_POPULATE_READ)
        _madvise(base + offset, PIECE, mmap.MADV_DONTNEED)
        os.posix_fadvise(fd, offset, PIECE, os.POSIX_FADV_DONTNEED)
        offset = (offset + PIECE) % (size - PIECE)


def _scratch(work: Path, nbytes: int) -> Path:
    path = work / "scratch.bin"
    if not path.exists() or path.stat().st_size != nbytes:
        with path.open("wb") as out:
            for _ in range(nbytes // PIECE):
                out.write(os.urandom(PIECE))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--model", default="bert-base", choices=["bert-base", "resnet50"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packrat-pools-bench"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / f"{args.model}.layers"
    if not path.exists():
        example = zoo.example_input(args.model, 1)
        write_layer_file(zoo.load_model(args.model), path, spec=args.model, example=example)
    scratch = str(_scratch(args.work, 32 * PIECE))
    lf = LayerFile(path)
    lm = LayeredModel(build_mapped(functools.partial(zoo.load_model, args.model), lf), lf)
    x = zoo.example_input(args.model, 1)
    lm(x, "load")

    def compute() -> float:
        return statistics.median(lm(x, "load")[1].wall_s for _ in range(3))

    runs: dict[str, list[float]] = {"alone": [], "thread": [], "process": []}
    ctx = multiprocessing.get_context("fork")
    for _ in range(args.reps):
        runs["alone"].append(compute())
        stop_t = threading.Event()
        thread = threading.Thread(target=_reader, args=(scratch, stop_t))
        thread.start()
        runs["thread"].append(compute())
        stop_t.set()
        thread.join()
        stop_p = ctx.Event()
        proc = ctx.Process(target=_reader, args=(scratch, stop_p))
        proc.start()
        time.sleep(0.3)  # its start-up is not reading
        runs["process"].append(compute())
        stop_p.set()
        proc.join()
    med = {k: statistics.median(v) for k, v in runs.items()}
    out: dict[str, Any] = {
        "model": args.model,
        "load_avg": os.getloadavg(),
        "runs": runs,
        "median": med,
        "thread_over_alone": med["thread"] / med["alone"],
        "process_over_alone": med["process"] / med["alone"],
    }
    print(
        f"{args.model}: compute alone {med['alone']:.3f} s, beside a reader thread "
        f"{med['thread']:.3f} s ({out['thread_over_alone']:.2f}x), beside a reader process "
        f"{med['process']:.3f} s ({out['process_over_alone']:.2f}x); load {out['load_avg'][0]:.1f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
