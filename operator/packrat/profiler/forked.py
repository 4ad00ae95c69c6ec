"""The profiler's fork server: ``python -m packrat.profiler.forked --model SPEC [...]``.

It imports torch and builds the model (or loads an archive's handler) once, with one thread
per runtime so that no thread pool exists (:mod:`packrat.runtime.forkserver` checks that
before every fork), and never runs the model itself: every forked worker starts from the
same untouched state, pins itself to its cores, sets its threads and serves the worker
protocol of :mod:`packrat.profiler.worker` (:func:`~packrat.profiler.worker.run_forked`).
The parent's side is :class:`packrat.profiler.client.ForkedWorkers`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from packrat.runtime.forkserver import server_main


def main(argv: Sequence[str] | None = None) -> int:
    from packrat.profiler import worker

    parser = argparse.ArgumentParser(prog="python -m packrat.profiler.forked")
    worker.add_target_args(parser, engine_help="the engine each worker loads")
    args = parser.parse_args(argv)
    targets: list[worker.Target] = []

    def preload() -> dict[str, Any]:
        import torch

        torch.set_num_threads(1)  # building the model starts no intra-op pool
        target = worker.target_from_args(args)
        targets.append(target)
        return {"load_s": target.load_s}

    try:
        return server_main(preload, lambda request: worker.run_forked(targets[0], request))
    finally:
        for target in targets:
            target.cleanup()


if __name__ == "__main__":
    sys.exit(main())
