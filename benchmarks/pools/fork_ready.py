"""A forked worker of a warm pool: how soon is it ready? (issue 39, the forked-workers
paragraph of the section on many models in one pool).

In a process with torch imported and a model's layer file resident (a warm pool), times five
times each: building the model from its mapped file in the process itself, and forking a
worker that builds it from the mapping and answers one request (fork to first answer, the
first forward pass included). Uses the layer files that ``pool_bench.py`` writes.

    flock /tmp/packrat-bench.lock python benchmarks/pools/fork_ready.py \
        benchmarks/results/pools/fork_ready.json
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

import torch

from packrat.runtime import zoo
from packrat.runtime.layerfile import LayerFile, build_mapped

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a cold start take when a model\'s layers are read while it runs?"'
    ', part "forked workers in the pool"'
    " (#how-long-does-a-cold-start-take-when-a-models-layers-are-read-while-it-runs)"
)

FILES = {
    "resnet50": "/tmp/packrat-pools-bench/pool/files/resnet50-00.layers",
    "bert-base": "/tmp/packrat-pools-bench/pool/files/bertbase-01.layers",
}


def _child(spec: str, path: str, x: torch.Tensor | tuple[torch.Tensor, ...], w: int) -> None:
    start = time.perf_counter()
    model = build_mapped(functools.partial(zoo.load_model, spec), LayerFile(Path(path)))
    built = time.perf_counter()
    with torch.inference_mode():
        model(*x) if isinstance(x, tuple) else model(x)
    os.write(w, json.dumps([built - start, time.perf_counter()]).encode())
    os._exit(0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("out", type=Path, help="the raw results (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = {}
    for spec, path in FILES.items():
        x = zoo.example_input(spec, 1)
        warm = LayerFile(Path(path))
        for i in range(len(warm.layers)):
            warm.read_layer(i)  # resident: a warm pool's model
        ready, built, inproc = [], [], []
        for _ in range(5):
            start = time.perf_counter()
            build_mapped(functools.partial(zoo.load_model, spec), LayerFile(Path(path)))
            inproc.append(time.perf_counter() - start)
            r, w = os.pipe()
            start = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(spec, path, x, w)
            os.close(w)
            msg = json.loads(os.read(r, 1000))
            os.close(r)
            os.waitpid(pid, 0)
            built.append(msg[0])
            ready.append(msg[1] - start)
        out[spec] = {
            "build_in_process_ms": [1000 * v for v in inproc],
            "build_in_fork_ms": [1000 * v for v in built],
            "fork_to_first_answer_ms": [1000 * v for v in ready],
            "load_avg": os.getloadavg(),
        }
        print(
            f"{spec} build in process {1000 * statistics.median(inproc):.0f} ms, build in "
            f"forked worker {1000 * statistics.median(built):.0f} ms, fork to first answer "
            f"{1000 * statistics.median(ready):.0f} ms (medians of 5) load {os.getloadavg()[0]}",
            flush=True,
        )
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
