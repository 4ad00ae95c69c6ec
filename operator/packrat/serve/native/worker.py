"""One native worker: pin, load, say hello, then answer batches until the pod closes the socket.

Forked from the pod's zygote (which imported torch and mapped the weights) or started as a
fresh interpreter (``python -m packrat.serve.native.worker``), with its channel to the pod on
a file descriptor (:mod:`packrat.serve.native.protocol`). The very first thing it does is pin
itself to its instance's cores with its thread count, before any weight is loaded or any
thread pool exists; then it loads either

- a zoo model or TorchScript file (``packrat_model.json`` in its model directory), served by
  the same :class:`~packrat.serve.modelservice.ModelService` TorchServe's workers run, so a
  malformed request is a 400 of its own on both runtimes; or
- a user's ``.mar`` (extracted by the pod), whose handler is loaded by TorchServe's own model
  loader and called through TorchServe's ``Service.predict`` (:mod:`packrat.runtime.mar`), so
  its ``initialize`` / ``preprocess`` / ``inference`` / ``postprocess`` run unchanged, and a
  handler that raises fails its whole batch, as on TorchServe. On an engine other than
  eager, the handler's ``model`` is swapped for the profile's converted artefact of it
  (:mod:`packrat.runtime.engines.handler`).

One batch at a time, in the order the pod sends them; the pod never sends a second batch
before the first's reply. Exits 0 when the pod closes the channel, 1 when loading failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from packrat.serve.native import protocol
from packrat.serve.native.protocol import Item, Result

log = logging.getLogger("packrat.native.worker")

Runner = Callable[[list[Item]], list[Result]]


def _zoo_runner(model_dir: Path, weights: Path | None, engine: str, threads: int) -> Runner:
    from packrat.runtime.mar import request_row
    from packrat.serve.modelservice import BatchContext, ModelService

    spec = json.loads((model_dir / "packrat_model.json").read_text())
    service = ModelService(spec, model_dir, weights, engine=engine, threads=threads)

    def run(items: list[Item]) -> list[Result]:
        context = BatchContext(len(items))
        rows = [request_row(i.body, i.content_type) for i in items]  # forms split: TorchServe's
        answers = service.handle(rows, context)
        return [
            Result(status, ctype, a if isinstance(a, bytes) else str(a).encode())
            for a, status, ctype in zip(answers, context.statuses, context.types, strict=True)
        ]

    return run


ARCHIVE_FILE = "packrat_archive.json"  # a .mar's model dir: the archive's name and digest


def _mar_runner(model_dir: Path, name: str, batch: int, engine: str, threads: int) -> Runner:
    from packrat.runtime.mar import HandlerService

    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    extracted = (model_dir, manifest)
    service = HandlerService(
        mar=model_dir, workdir=model_dir, batch_size=batch, name=name, extracted=extracted
    )
    if engine != "eager":  # the profile's artefact of the handler's module, swapped in
        from packrat.runtime.engines.cache import load_for_archive
        from packrat.runtime.engines.handler import swap

        archive = json.loads((model_dir / ARCHIVE_FILE).read_text())
        runner, artefact = load_for_archive(
            model=archive["model"], digest=archive["digest"], name=engine, threads=threads
        )
        swap(service, runner, artefact.inputs)
        log.info("packrat: the handler's model runs on %s (%s)", engine, artefact.path)

    def run(items: list[Item]) -> list[Result]:
        answers = service.predict_each([(i.body, i.content_type) for i in items])
        return [Result(status, ctype, body) for status, ctype, body in answers]

    return run


def load(args: argparse.Namespace) -> Runner:
    """Pin, then load the instance's model; the runner answers one batch."""
    from packrat.runtime.pinning import pin_current_process

    cpus = [int(c) for c in args.cpus.split(",")]
    pin_current_process(cpus, threads=args.threads)
    log.info("packrat: %s pinned to cpus %s with %d threads (pid %d)",
             args.name, cpus, args.threads, os.getpid())  # fmt: skip
    model_dir = Path(args.model_dir)
    if args.kind == "mar":
        return _mar_runner(model_dir, args.name, args.batch, args.engine, args.threads)
    weights = Path(args.weights) if args.weights else None
    return _zoo_runner(model_dir, weights, args.engine, args.threads)


def serve(channel: socket.socket, run: Runner) -> int:
    """Answer batches until the pod closes ``channel``."""
    first = True
    while True:
        payload = protocol.recv_frame(channel)
        if payload is None:
            return 0
        batch_id, items = protocol.decode_batch(payload)
        start = time.monotonic()
        try:
            results = run(items)
            if first:  # the warm-up: its cost shows in the log
                log.info(
                    "packrat: first batch of %d in %.3f s", len(items), time.monotonic() - start
                )
                first = False
        except Exception as exc:  # the service itself broke: the batch fails, the worker lives
            log.exception("packrat: batch %d failed", batch_id)
            body = json.dumps(
                {"code": 503, "type": "InternalServerException", "message": f"{exc}"[:500]}
            ).encode()
            results = [Result(503, "application/json", body)] * len(items)
        protocol.send_frame(channel, protocol.encode_reply(batch_id, results))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m packrat.serve.native.worker")
    parser.add_argument("--fd", type=int, required=True, help="the channel to the pod")
    parser.add_argument("--name", required=True)
    parser.add_argument("--cpus", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--kind", choices=("model", "mar"), required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--weights")
    parser.add_argument("--engine", default="eager", help="packrat.runtime.engines name")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    began = time.monotonic()  # forked from the zygote: nothing ran in this process before
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    channel = socket.socket(fileno=args.fd)
    try:
        run = load(args)
    except Exception as exc:  # one line for the pod's log and /status, then exit
        log.exception("packrat: %s failed to load", args.name)
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        protocol.send_frame(channel, protocol.encode_hello({"ok": False, "error": message}))
        return 1
    # When it began and when it held the model (the pod's start-up timeline).
    marks = {"began": began, "loaded": time.monotonic()}
    hello = {"ok": True, "pid": os.getpid(), "marks": marks}
    protocol.send_frame(channel, protocol.encode_hello(hello))
    try:
        return serve(channel, run)
    except (OSError, protocol.ProtocolError) as exc:
        log.warning("packrat: %s: the channel to the pod broke: %s", args.name, exc)
        return 0


if __name__ == "__main__":
    sys.exit(main())
