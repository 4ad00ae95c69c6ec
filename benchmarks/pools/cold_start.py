"""Cold starts that overlap loading with compute (issue 39, figure "cold start, layer-ordered
prefetch vs max(read, compute) and vs load-then-run").

For each model (ResNet-50, BERT-base with its embedding tables read in place, BERT-base
reading every layer; ``/blocks``: the same model in a file with one layer per bottleneck or
encoder layer, as layout 1 had, for the granularity lever), a per-layer weight file is
written once; then, per read rate (the local disk unthrottled, and a rate-limited read path
standing in for a network volume: one where reading the model takes about as long as
computing it, one twice as long), the script repeats, interleaved, with the model's pages
dropped (madvise + fadvise, checked with mincore: 0 bytes left or the run stops) before each
cold run:

    compute alone (warm) | read alone | load-then-run | demand (layer read when reached) |
    layer-ordered prefetch, in each configuration asked for (--prefetch)

The prefetch configurations: ``prefetch`` is the pool's (a read-ahead window of
``READ_AHEAD_BYTES``, the reader on a core of its own where one is spare); ``prefetch-
unpinned`` the same window with reader and compute free to share cores; ``prefetch-1ahead``
one layer ahead (window 0), pinned; ``prefetch-no-rows`` the pool's without asking for an
in-place embedding's rows ahead of its lookup. The compute runs on one torch thread on the
compute core (pinned as the pool pins its compute threads) except in the unpinned
configuration. It reports medians, ranges and the ratios prefetch / max(read, compute)
(target <= 1.15), prefetch / load-then-run (target <= 0.7 where reading takes at least as
long as computing) and prefetch / the layer-wise pipeline's own bound (plan.lcache's
recurrence, the pool's window, from the per-layer compute times and bytes).

    flock /tmp/packrat-bench.lock python benchmarks/pools/cold_start.py \
        --out benchmarks/results/pools/cold_start.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from packrat.plan.pool.lcache import pipeline_latency
from packrat.runtime import zoo
from packrat.runtime.layerfile import LayerFile, RateLimiter, build_mapped, write_layer_file
from packrat.runtime.pinning import reader_split
from packrat.runtime.pipelined import READ_AHEAD_BYTES, LayeredModel, embedding_layers, layer_times

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a cold start take when a model\'s layers are read while it runs?"'
    " (#how-long-does-a-cold-start-take-when-a-models-layers-are-read-while-it-runs)"
)

# name: (spec, embeddings read in place, one layer per block)
VARIANTS = {
    "resnet50": ("resnet50", True, False),
    "bert-base": ("bert-base", True, False),
    "bert-base/read-all": ("bert-base", False, False),
    "resnet50/blocks": ("resnet50", True, True),
    "bert-base/blocks": ("bert-base", True, True),
}
# name: (read-ahead bytes, pinned, an in-place embedding's rows asked for ahead of its lookup)
PREFETCH = {
    "prefetch": (READ_AHEAD_BYTES, True, True),
    "prefetch-unpinned": (READ_AHEAD_BYTES, False, True),
    "prefetch-1ahead": (0, True, True),
    "prefetch-no-rows": (READ_AHEAD_BYTES, True, False),
}


def _block(unit: str) -> str:
    """``layer3.0.conv1`` -> ``layer3.0``, ``layers.5.query`` -> ``layers.5``, ``fc`` -> ``fc``."""
    parts = unit.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else unit


def _file(spec: str, blocks: bool, work: Path) -> Path:
    path = work / f"{spec}.{'blocks' if blocks else 'v2'}.layers"
    if not path.exists():
        model = zoo.load_model(spec)
        example = zoo.example_input(spec, 1)
        write_layer_file(
            model, path, spec=spec, example=example, group_key=_block if blocks else None
        )
    return path


def _cold(lm: LayeredModel) -> None:
    """Drop the model's pages and check with mincore that they are gone (a file just
    written may still be under writeback: a few tries)."""
    for _ in range(50):
        lm.lf.evict_all()
        left = sum(lm.lf.resident_layers())
        if not left:
            return
        time.sleep(0.1)
    where = [(la.name, r) for la, r in zip(lm.lf.layers, lm.lf.resident_layers(), strict=True)]
    raise RuntimeError(f"{left} bytes still resident after eviction: {[w for w in where if w[1]]}")


class _Cores:
    """The compute core(s) and the reader's, as the pool splits them (None: no spare core)."""

    def __init__(self) -> None:
        self.all = frozenset(os.sched_getaffinity(0))
        self.compute, self.reader = reader_split(self.all, 1) or (self.all, self.all)

    def pin(self, lm: LayeredModel, pinned: bool) -> None:
        os.sched_setaffinity(0, self.compute if pinned else self.all)  # this (compute) thread
        lm.reader_cpus = self.reader if pinned else None


def _cpu_times() -> dict[str, list[int]]:
    """Per CPU, jiffies so far: user+nice, system, irq+softirq, iowait, idle, steal (where the
    machine's time went during a rate's runs: the reads' kernel work, interrupts, the host)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *v = line.split()
            f = [int(n) for n in v[:8]]
            out[name] = [f[0] + f[1], f[2], f[5] + f[6], f[4], f[3], f[7]]
    return out


def _read_alone(lm: LayeredModel, cores: _Cores) -> float:
    _cold(lm)
    need = lm.missing()
    os.sched_setaffinity(0, cores.reader)
    try:
        start = time.perf_counter()
        for i, n in enumerate(need):
            if n:
                lm.lf.read_layer(i, lm.limiter)
        return time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, cores.compute)


def _bound(lm: LayeredModel, x: Any, read_s: float, compute_s: float) -> float:
    """The layer-wise pipeline's own limit (plan.lcache's recurrence, the pool's window)
    from this run's per-layer compute times and the measured read time spread over the
    layers by their bytes."""
    per_layer = layer_times(lm, x, reps=3)
    scale = compute_s / sum(per_layer)
    sizes = [0 if i in lm.in_place else la.length for i, la in enumerate(lm.lf.layers)]
    copy = [read_s * b / sum(sizes) for b in sizes]
    return pipeline_latency(
        copy,
        [c * scale for c in per_layer],
        window_bytes=READ_AHEAD_BYTES,
        layer_bytes=sizes,
    )


def _one_rate(
    lm: LayeredModel, x: Any, rate: float | None, reps: int, prefetch: list[str], cores: _Cores
) -> dict[str, Any]:
    lm.limiter = RateLimiter(rate) if rate else None
    runs: dict[str, list[float]] = {k: [] for k in ("compute", "read", "load", "demand")}
    for name in prefetch:
        runs[name] = []
        runs[f"{name}/stall"] = []
    before = _cpu_times()
    for _ in range(reps):
        cores.pin(lm, True)
        lm(x, "load")  # warm
        runs["compute"].append(lm(x, "load")[1].wall_s)
        runs["read"].append(_read_alone(lm, cores))
        for mode in ("load", "demand"):
            _cold(lm)
            runs[mode].append(lm(x, mode)[1].wall_s)  # type: ignore[arg-type]
        for name in prefetch:
            window, pinned, rows = PREFETCH[name]
            cores.pin(lm, pinned)
            lm.prefetch_rows = rows
            _cold(lm)
            stats = lm(x, "prefetch", read_ahead_bytes=window)[1]
            lm.prefetch_rows = True
            runs[name].append(stats.wall_s)
            runs[f"{name}/stall"].append(stats.stall_s)  # its waits for its reader
    after = _cpu_times()
    cores.pin(lm, True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    bound = _bound(lm, x, med["read"], med["compute"])
    top = max(med["read"], med["compute"])
    return {
        "pipeline_bound_s": bound,
        "rate_bps": rate,
        "runs": runs,
        "median": med,
        "cpu_jiffies": {  # user, system, irq, iowait, idle, steal during these runs
            cpu: [x - y for x, y in zip(after[cpu], before[cpu], strict=True)] for cpu in after
        },
        "ratios": {
            name: {
                "over_max": med[name] / top,
                "over_load": med[name] / med["load"],
                "over_bound": med[name] / bound,
                # compute beside the reader: the prefetch less its waits, against compute alone
                "compute_beside_reads": (med[name] - med[f"{name}/stall"]) / med["compute"],
            }
            for name in prefetch
        },
    }


def _print(name: str, rate: float | None, r: dict[str, Any], prefetch: list[str]) -> None:
    m = r["median"]
    label = "disk" if rate is None else f"{rate / 1e6:.0f} MB/s"
    line = (
        f"{name:20s} {label:>10s} compute {m['compute']:.3f} read {m['read']:.3f} "
        f"load {m['load']:.3f} demand {m['demand']:.3f} bound {r['pipeline_bound_s']:.3f}"
    )
    for p in prefetch:
        q = r["ratios"][p]
        line += (
            f" | {p} {m[p]:.3f} /max {q['over_max']:.2f} /load {q['over_load']:.2f} "
            f"/bound {q['over_bound']:.2f} stall {m[p + '/stall']:.3f} "
            f"beside {q['compute_beside_reads']:.2f}x"
        )
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS)[:3], choices=list(VARIANTS))
    parser.add_argument("--prefetch", nargs="+", default=list(PREFETCH), choices=list(PREFETCH))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packrat-pools-bench"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cores = _Cores()
    results: dict[str, Any] = {
        "load_avg": os.getloadavg(),
        "cores": {"compute": sorted(cores.compute), "reader": sorted(cores.reader)},
        "read_ahead_bytes": READ_AHEAD_BYTES,
        "variants": {},
    }
    built: dict[Path, LayeredModel] = {}  # one mapping per file: a second one would keep
    # the pages the first maps in the page cache, and eviction through it would not drop them
    for name in args.variants:
        spec, in_place, blocks = VARIANTS[name]
        path = _file(spec, blocks, args.work)
        if path not in built:
            lf = LayerFile(path)
            built[path] = LayeredModel(
                build_mapped(functools.partial(zoo.load_model, spec), lf), lf
            )
        lm = built[path]
        lf = lm.lf
        lm.in_place = embedding_layers(lm.model, lf) if in_place else frozenset()
        x = zoo.example_input(spec, 1)
        cores.pin(lm, True)
        lm(x, "load")
        compute = statistics.median(lm(x, "load")[1].wall_s for _ in range(3))
        read_bytes = sum(la.length for i, la in enumerate(lf.layers) if i not in lm.in_place)
        rates: list[float | None] = [None, read_bytes / compute, read_bytes / (2 * compute)]
        out = {
            "file_bytes": lf.total_bytes,
            "read_bytes": read_bytes,
            "layers": len(lf.layers),
            "rates": [],
        }
        for rate in rates:
            r = _one_rate(lm, x, rate, args.reps, args.prefetch, cores)
            out["rates"].append(r)
            _print(name, rate, r, args.prefetch)
        results["variants"][name] = out
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))  # kept as it goes
    results["load_avg_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
