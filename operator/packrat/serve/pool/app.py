"""The pool serving process: many models behind one HTTP server, weights under a budget.

    python -m packrat.serve.pool CONFIG.json [--host 127.0.0.1] [--port 8080] [--directory DIR]
        [--admin-token-file FILE]

Each model answers on its own names, as a single-model pod does: Open Inference Protocol v2
(``/v2/models/{name}``, ``/ready``, ``/infer``; the request codec is the dispatcher's,
:mod:`packrat.serve.dispatcher.v2_codec`) and ``POST /predictions/{name}`` (one sample, raw
bytes or JSON, :mod:`packrat.serve.codec`). ``GET /metrics`` gives Prometheus text per model
(resident bytes measured with ``mincore``, requests, cold starts, bytes read, last use), a
snapshot at most 2 s old as a serving pod's; ``GET /pool/status`` the same as JSON, live,
with the pool's budget, read rate and memory peaks: with ``--admin-token-file``, only for a
request bearing that token (a 401 otherwise; the operator's pool reader sends it).

The configuration file is watched (a mounted ConfigMap: the kubelet swaps in a new version
without restarting the pod): when its content changes, the new models are built and the
ones it no longer names dropped while every other model keeps serving; a file that does not
parse, or a model that cannot be built, is reported on stdout and the last good
configuration keeps serving.

Bounded: a request body is capped (``--max-body``), at most ``--max-queue`` requests wait
for the compute threads (a 503 beyond), each waits at most ``--timeout`` seconds (a 504). A
malformed request is a 400 for that request alone. A v2 body is parsed as the dispatcher
parses it (issue 38): off the event loop in its bounded parse pool (a 503 when its line is
full), its declared inputs checked against the model before any data is flattened, at most
``--max-samples`` samples, and the body capped at what that many samples take as JSON
(:func:`body_cap`: 48 bytes a number; a 413 beyond, and a body whose length says so is
never buffered). Before, two clients posting 10 MB JSON bodies to one model took another
model's p50 from 6 ms to 1,275 ms: each body was parsed whole on the event loop, and only
then refused for its samples.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from packrat.runtime.layerfile import LayerFileError
from packrat.serve import codec
from packrat.serve.auth import AdminToken, bearer_accepted, token_file
from packrat.serve.dispatcher.metrics import METRICS_INTERVAL_S, Snapshot
from packrat.serve.dispatcher.v2 import ParseBusyError, ParsePool, header_length, parse_split
from packrat.serve.dispatcher.v2_codec import (
    MAX_SAMPLES,
    InferRequest,
    V2Error,
    build_response,
    model_metadata,
)
from packrat.serve.pool.host import (
    CONFIG_MAX_BYTES,
    ConfigError,
    ModelGoneError,
    Pool,
    PoolModel,
    SpoiledError,
    read_config,
)

__all__ = ["build_app", "main"]

HEADER_LENGTH = "Inference-Header-Content-Length"
POOL: web.AppKey[Pool] = web.AppKey("pool", Pool)
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)
TOKEN: web.AppKey[AdminToken] = web.AppKey("admin_token")
METRICS_INTERVAL: web.AppKey[float] = web.AppKey("metrics_interval_s", float)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


JSON_NUMBER_BYTES = 48  # the longest float repr (24) with a separator and some indentation


def body_cap(inputs: list[dict[str, Any]], max_samples: int, max_body: int) -> int:
    """The largest v2 body worth reading for a model: ``max_samples`` samples of its inputs
    written as JSON, and 64 KiB for the rest of the document (names, parameters, outputs).
    A JSON body costs about 0.1 s of CPU per MB to parse, in which the GIL is held."""
    numbers = sum(math.prod(int(n) for n in i["shape"]) for i in inputs)
    return min(max_body, max_samples * numbers * JSON_NUMBER_BYTES + (64 << 10))


class _Runner:
    """The compute threads, the wait bound and the queue bound."""

    def __init__(self, pool: Pool, *, max_queue: int, timeout_s: float, max_samples: int) -> None:
        self.pool, self.max_queue, self.timeout_s = pool, max_queue, timeout_s
        self.max_samples = max_samples
        self.executor = ThreadPoolExecutor(
            pool.config.threads, thread_name_prefix="pool", initializer=pool.pin_compute_thread
        )
        self.parser = ParsePool()
        self.waiting = 0
        self._lock = threading.Lock()

    async def run(self, name: str, bodies: list[bytes]) -> list[str] | web.Response:
        """A place is taken until the request's job ends, not until its client stops waiting
        (before, each 504 freed its place while its job stayed queued: a client whose
        requests time out queued jobs, and their bodies, without bound)."""
        with self._lock:
            if self.waiting >= self.max_queue:
                return _error(503, f"{self.waiting} requests already waiting; retry later")
            self.waiting += 1
        try:
            loop = asyncio.get_running_loop()
            job = loop.run_in_executor(self.executor, self.pool.infer, name, bodies)
        except BaseException:
            self._free(None)
            raise
        job.add_done_callback(self._free)
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.timeout_s)
        except TimeoutError:
            return _error(504, f"no answer within {self.timeout_s:g} s")
        except codec.CodecError as exc:
            return _error(400, str(exc))
        except ModelGoneError as exc:
            return _error(404, str(exc))
        except SpoiledError as exc:
            return _error(503, str(exc))

    def _free(self, job: asyncio.Future[list[str]] | None) -> None:
        if job is not None and not job.cancelled():
            job.exception()  # retrieved: a timed-out job's error is no "never retrieved" log
        with self._lock:
            self.waiting -= 1


class _Handlers:
    """The pool's HTTP handlers over one runner (its pool, threads and parse pool)."""

    def __init__(self, runner: _Runner) -> None:
        self.runner, self.pool = runner, runner.pool
        self.snapshot = Snapshot()

    def routes(self) -> list[web.RouteDef]:
        model = "/v2/models/{model}"
        return [
            web.get("/v2/health/live", self.ready),
            web.get("/v2/health/ready", self.ready),
            web.get(model, self.metadata),
            web.get(f"{model}/ready", self.ready),
            web.post(f"{model}/infer", self.infer),
            web.post("/predictions/{model}", self.predictions),
            web.get("/pool/status", self.status),
            web.get("/metrics", self.metrics),
        ]

    def lookup(self, request: web.Request) -> PoolModel | web.Response:
        """The model the request names, read once (a reconfigure may drop it meanwhile)."""
        name = request.match_info["model"]
        model = self.pool.models.get(name)
        return _error(404, f"model {name!r} is not in this pool") if model is None else model

    async def ready(self, request: web.Request) -> web.Response:
        if "model" in request.match_info and isinstance(got := self.lookup(request), web.Response):
            return got
        return web.json_response({"ready": True})

    async def metadata(self, request: web.Request) -> web.Response:
        if isinstance(model := self.lookup(request), web.Response):
            return model
        return web.json_response(model_metadata(model.name, model.inputs))

    async def infer(self, request: web.Request) -> web.Response:
        if isinstance(model := self.lookup(request), web.Response):
            return model
        name = model.name
        parsed = await self._parse_v2(request, name, model.inputs)
        if isinstance(parsed, web.Response):
            return parsed
        req, samples = parsed
        got = await self.runner.run(name, [b for b, _ in samples])
        if isinstance(got, web.Response):
            return got
        payload, head = build_response(name, req, [a.encode() for a in got], raw_bytes=False)
        if head is None:
            return web.Response(body=payload, content_type="application/json")
        return web.Response(
            body=payload,
            content_type="application/octet-stream",
            headers={HEADER_LENGTH: str(head)},
        )

    @staticmethod
    async def _read_capped(request: web.Request, cap: int) -> bytes | None:
        """The body, or None when it is larger than ``cap`` (unread when its length says so:
        aiohttp discards it; a chunked one is read up to ``--max-body`` first)."""
        if (request.content_length or 0) > cap:
            return None
        body = await request.read()
        return None if len(body) > cap else body

    async def _parse_v2(
        self, request: web.Request, name: str, inputs: list[dict[str, Any]]
    ) -> tuple[InferRequest, list[tuple[bytes, str]]] | web.Response:
        """The v2 request and its samples, parsed in the parse pool with the body capped at
        :func:`body_cap`; or the error answer (413, 400, 503)."""
        runner = self.runner
        cap = body_cap(inputs, runner.max_samples, request.app[MAX_BODY])
        if (body := await self._read_capped(request, cap)) is None:
            return _error(413, f"a request to {name} is at most {cap} bytes")
        try:
            return await runner.parser.run(
                parse_split,
                body,
                header_length(request.headers.get(HEADER_LENGTH)),
                inputs,
                runner.max_samples,
                size=len(body),
            )
        except V2Error as exc:
            return _error(400, str(exc))
        except ParseBusyError:
            return _error(503, "too many requests being parsed; retry later")

    async def predictions(self, request: web.Request) -> web.Response:
        """One sample, its body capped at that sample's size as JSON (at least 64 KiB, as a
        serving pod caps it): before, 16 MiB went to the compute thread's JSON parser."""
        if isinstance(model := self.lookup(request), web.Response):
            return model
        cap = codec.input_body_cap(model.inputs, request.app[MAX_BODY])
        if (body := await self._read_capped(request, cap)) is None:
            return _error(413, f"a request to {model.name} is at most {cap} bytes")
        got = await self.runner.run(model.name, [body])
        if isinstance(got, web.Response):
            return got
        return web.Response(text=got[0], content_type="application/json")

    async def status(self, request: web.Request) -> web.Response:
        token = request.app[TOKEN]
        if token and not bearer_accepted(request.headers.get("Authorization", ""), token):
            return _error(401, "a valid bearer token is required")
        return web.json_response(await asyncio.to_thread(self.pool.status))

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.snapshot.fresh(request.app[METRICS_INTERVAL])
        if body is None:  # rendered off the event loop (pool.status reads mincore)
            status = await asyncio.to_thread(self.pool.status)
            body = self.snapshot.keep(_prometheus(status).encode())
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


def _prometheus(status: dict[str, object]) -> str:
    models = status["models"]
    assert isinstance(models, dict)
    lines = []
    for metric, key, kind in (
        ("packrat_pool_resident_bytes", "resident_bytes", "gauge"),
        ("packrat_pool_requests_total", "requests", "counter"),
        ("packrat_pool_cold_starts_total", "cold_starts", "counter"),
        ("packrat_pool_read_bytes_total", "read_bytes", "counter"),
        ("packrat_pool_last_use_seconds", "last_use", "gauge"),
        ("packrat_pool_threads", "threads", "gauge"),
    ):
        lines.append(f"# TYPE {metric} {kind}")
        lines += [f'{metric}{{model="{n}"}} {m[key]}' for n, m in models.items()]
    lines.append("# TYPE packrat_pool_budget_bytes gauge")
    lines.append(f"packrat_pool_budget_bytes {status['budget_bytes']}")
    return "\n".join(lines) + "\n"


def build_app(
    pool: Pool,
    *,
    max_body: int = 16 << 20,
    max_queue: int = 256,
    timeout_s: float = 60.0,
    max_samples: int = MAX_SAMPLES,
    admin_token: AdminToken = None,
    metrics_interval_s: float = METRICS_INTERVAL_S,
) -> web.Application:
    """``admin_token``: ``/pool/status`` needs it (a 401 without; none: it is public, as
    before); ``/metrics`` is a snapshot at most ``metrics_interval_s`` old, as a pod's."""
    app = web.Application(client_max_size=max_body)
    app[POOL] = pool
    app[MAX_BODY] = max_body
    app[TOKEN] = admin_token
    app[METRICS_INTERVAL] = metrics_interval_s
    runner = _Runner(pool, max_queue=max_queue, timeout_s=timeout_s, max_samples=max_samples)
    app.add_routes(_Handlers(runner).routes())

    stop = threading.Event()

    def sample() -> None:  # the memory peaks, between requests too
        while not stop.wait(0.5):
            pool.sample_memory()

    async def start(_app: web.Application) -> None:
        threading.Thread(target=sample, name="pool-memory", daemon=True).start()

    async def close(_app: web.Application) -> None:
        stop.set()
        runner.executor.shutdown(wait=False, cancel_futures=True)
        runner.parser.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    return app


def _digest(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return hashlib.sha256(f.read(CONFIG_MAX_BYTES + 1)).hexdigest()
    except OSError:
        return None


def watch_config(
    pool: Pool, path: Path, *, directory: Path | None, stop: threading.Event, every: float = 1.0
) -> None:
    """Reload ``path`` into ``pool`` whenever its content changes, until ``stop``."""
    last = _digest(path)
    while not stop.wait(every):
        now = _digest(path)
        if now is None or now == last:
            continue
        last = now
        try:
            config = read_config(path)
            if directory is not None:
                config = dataclasses.replace(config, directory=directory)
            added, removed = pool.reconfigure(config)
        except Exception as exc:  # any failure: report it, the last good config serves on
            print(f"packrat pool: {path}: {exc}; the last good configuration serves", flush=True)
            continue
        print(f"packrat pool: reloaded: added {added}, removed {removed}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.serve.pool", description=__doc__)
    parser.add_argument("config", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-body", type=int, default=16 << 20)
    parser.add_argument("--max-queue", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES, help="per v2 request")
    parser.add_argument(
        "--directory", type=Path, help="where the layer files live (overrides the config's)"
    )
    parser.add_argument(
        "--admin-token-file",
        type=Path,
        help="the pool's bearer token (a mounted Secret, read again when it changes; a file "
        "'previous' beside it holds a second accepted token): GET /pool/status needs it",
    )
    args = parser.parse_args(argv)
    if args.max_samples < 1:
        parser.error("--max-samples must be >= 1")
    try:
        token = token_file(args.admin_token_file) if args.admin_token_file else None
    except ValueError as exc:
        parser.error(str(exc))
    try:
        config = read_config(args.config)
        if args.directory is not None:  # a writable volume; the config may be read-only
            config = dataclasses.replace(config, directory=args.directory)
    except ConfigError as exc:
        print(f"packrat pool: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one core per compute thread: the pool shares its node
    try:
        pool = Pool(config)
    except (LayerFileError, OSError) as exc:  # a layer file that cannot be written or read
        print(f"packrat pool: error: {exc}", file=sys.stderr)
        return 2
    app = build_app(pool, max_body=args.max_body, max_queue=args.max_queue,
                    timeout_s=args.timeout, max_samples=args.max_samples,
                    admin_token=token)  # fmt: skip
    stop = threading.Event()
    watcher = threading.Thread(
        target=watch_config,
        args=(pool, args.config),
        kwargs={"directory": args.directory, "stop": stop},
        name="pool-config",
        daemon=True,
    )
    watcher.start()
    print(f"packrat pool: {len(pool.models)} models on {args.host}:{args.port}", flush=True)
    try:
        web.run_app(app, host=args.host, port=args.port, print=None)
    finally:
        stop.set()
    return 0
