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
from pathlib import Path
from typing import Any

from packrat.runtime.forkserver import server_main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.profiler.forked")
    parser.add_argument("--model", required=True, help="zoo name or TorchScript file")
    parser.add_argument("--archive", help="a TorchServe .mar whose handler to run")
    parser.add_argument("--sample-request", help="file: the request body for --archive")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--engine", default="eager", help="the engine each worker loads")
    parser.add_argument("--artefact", help="the engine's converted artefact")
    args = parser.parse_args(argv)
    from packrat.profiler import worker

    targets: list[worker.Target] = []

    def preload() -> dict[str, Any]:
        import torch

        torch.set_num_threads(1)  # building the model starts no intra-op pool
        sample = Path(args.sample_request).read_bytes() if args.sample_request else None
        target = worker.load_target(
            args.model,
            archive=args.archive,
            sample_request=sample,
            content_type=args.content_type,
            engine=args.engine,
            artefact=args.artefact,
        )
        targets.append(target)
        return {"load_s": target.load_s}

    try:
        return server_main(preload, lambda request: worker.run_forked(targets[0], request))
    finally:
        for target in targets:
            target.cleanup()


if __name__ == "__main__":
    sys.exit(main())
