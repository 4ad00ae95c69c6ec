"""The native runtime, the pod's side: one worker process per plan instance, fed batches
directly by the dispatcher over a Unix socket.

It implements the serving seam's backend contract (:mod:`packrat.serve.pod.runtime`): one
endpoint per plan instance (:meth:`NativeRuntime.forward` by instance name), each worker pinned
to its cores with its thread count (it pins itself first, :mod:`packrat.serve.native.worker`),
ready only once loaded (the pod then warms it before marking it up), restarted when it dies,
and switchable in place (instances are added and removed by name, old beside new).

Each instance batches like a TorchServe registration: requests queue per instance, a batch
leaves when it holds ``batch`` requests or ``max_batch_delay_ms`` after the batch began to
form, and one batch is in the worker at a time while the next one forms. The queue is
bounded by the dispatcher's slots (at most two batches per instance outstanding), frames by
:data:`~packrat.serve.native.protocol.MAX_FRAME`, and a worker's reply by its batch's share of
answers: ``max_answer_bytes`` per request (issue 38: a 300 MiB answer in a 512 MiB frame took
the dispatcher to 1.2 GB). A longer reply is read past, never held, and its batch answered 502.

A worker that dies (killed, crashed, its channel broken), or does not answer a batch within
``response_timeout_s`` (300 s, TorchServe's default; it is then killed), fails its in-flight
batch and the requests queued for it at once, each with a 503 and ``Retry-After`` (never a
hang), and is started again at once, then with a backoff while it keeps failing; the pod's
monitor sees the new pid, warms it and marks the instance up again, as with TorchServe.

Workers are forked from the pod's zygote when there is one (torch imported, weights mapped:
nothing to import or load), else started as fresh interpreters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from packrat.serve.config import InstanceSpec, WorkerState
from packrat.serve.dispatcher.upstream import error_response
from packrat.serve.native import protocol
from packrat.serve.native.protocol import Item, Result
from packrat.serve.zygote.process import NATIVE_WORKER, ZygoteProcess, ZygoteStartError

__all__ = ["WORKER_MODULE", "NativeRuntime", "NativeStartError"]

log = logging.getLogger(__name__)

WORKER_MODULE = NATIVE_WORKER  # the zygote imports it before forking
LOAD_TIMEOUT_S = 600.0  # a big model on a busy node; the pod's readiness waits anyway
RESPONSE_TIMEOUT_S = 300.0  # a batch not answered by then: the worker is replaced (TorchServe's)
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
STABLE_S = 30.0  # a worker that lived this long restarts at once again
CHANNEL_BUFFER_BYTES = 4 * 1024 * 1024
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # one request's answer from a worker
MAX_HELLO_BYTES = 64 * 1024  # a worker's hello: its pid, an error line, start-up marks
_DRAIN_CHUNK = 1024 * 1024


class NativeStartError(RuntimeError):
    """A native worker did not load (its own one-line reason)."""


def _gone(reason: str) -> Result:
    """A 503 with the dispatcher's own error shape (``error_response``'s)."""
    doc = {"code": 503, "type": "ServiceUnavailableException", "message": reason}
    return Result(503, "application/json", json.dumps(doc).encode())


@dataclass
class _Pending:
    item: Item
    future: asyncio.Future[Result]


@dataclass
class _Worker:
    """One running worker process and its channel."""

    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    owner: socket.socket | None = None  # the zygote connection (closing it kills the worker)
    proc: subprocess.Popen[bytes] | None = None  # a fresh interpreter instead
    started: float = field(default_factory=time.monotonic)


class NativeInstance:
    """One plan instance: its worker, its queue and its batcher."""

    def __init__(self, runtime: NativeRuntime, inst: InstanceSpec) -> None:
        self.runtime = runtime
        self.inst = inst
        self.status = "LOADING"
        self.worker: _Worker | None = None
        self.error: str | None = None
        self.queue: deque[_Pending] = deque()
        self._arrived = asyncio.Event()
        self._inflight: list[_Pending] = []
        self._replied: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._restart: asyncio.Task[None] | None = None
        self._closing = False
        self._failures = 0
        self._batch_id = 0
        self.marks: dict[str, float] = {}  # when its worker began and loaded (monotonic)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker and wait until it has loaded (or raise its reason)."""
        self.status = "LOADING"
        worker = await self.runtime.spawn(self.inst)
        try:
            async with asyncio.timeout(self.runtime.load_timeout_s):
                payload = await _read_frame(worker.reader, MAX_HELLO_BYTES)
            hello = protocol.decode_hello(payload) if payload is not None else None
        except (TimeoutError, protocol.ProtocolError, OSError, asyncio.IncompleteReadError) as exc:
            hello = {"ok": False, "error": f"no hello from the worker: {type(exc).__name__}"}
        except asyncio.CancelledError:
            await self._kill(worker)
            raise
        if hello is None or not hello.get("ok"):
            await self._kill(worker)
            reason = (hello or {}).get("error") or "the worker exited while loading"
            self.status, self.error = "FAILED", str(reason)
            raise NativeStartError(f"{self.inst.name}: {reason}")
        self.worker, self.status, self.error = worker, "READY", None
        marks = hello.get("marks")
        self.marks = {  # the worker's own start-up marks (input: numbers only)
            str(k): float(v)
            for k, v in (marks.items() if isinstance(marks, dict) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        name = self.inst.name
        self._tasks = [
            asyncio.create_task(self._batches(worker), name=f"{name}-batches"),
            asyncio.create_task(self._replies(worker), name=f"{name}-replies"),
        ]
        log.info("native: %s ready (pid %d)", self.inst.name, worker.pid)

    async def close(self) -> None:
        """Stop the worker; whatever is queued or in flight is answered 503."""
        self._closing = True
        if self._restart is not None:
            self._tasks.append(self._restart)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_all("the instance was stopped")
        if self.worker is not None:
            await self._kill(self.worker)
            self.worker = None
        self.status = "STOPPED"

    def state(self) -> WorkerState:
        return WorkerState(self.status, self.worker.pid if self.worker else None)

    # -- requests -------------------------------------------------------------------------------
    async def submit(self, item: Item) -> Result:
        if self.status != "READY":
            return _gone("instance unreachable")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.queue.append(_Pending(item, future))
        self._arrived.set()
        return await future

    async def _batches(self, worker: _Worker) -> None:
        """Form batches and run them one at a time, until the worker dies or is closed."""
        delay = self.runtime.max_batch_delay_s
        while True:
            while not self.queue:
                self._arrived.clear()
                await self._arrived.wait()
            if len(self.queue) < self.inst.batch and delay > 0:
                deadline = time.monotonic() + delay
                while len(self.queue) < self.inst.batch:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await self._arrived.wait()
            batch = [self.queue.popleft() for _ in range(min(self.inst.batch, len(self.queue)))]
            batch = [p for p in batch if not p.future.done()]
            if not batch:
                continue
            self.runtime.on_batch(self.inst.name, len(batch) >= self.inst.batch)
            self._batch_id = (self._batch_id + 1) & 0xFFFFFFFF
            self._inflight = batch
            self._replied = asyncio.get_running_loop().create_future()
            try:
                worker.writer.write(protocol.encode_batch(self._batch_id, [p.item for p in batch]))
                await worker.writer.drain()
            except OSError as exc:
                self._died(worker, f"{type(exc).__name__}: {exc}")
                return
            try:  # the reader answers the batch, or the worker dies
                async with asyncio.timeout(self.runtime.response_timeout_s):
                    await asyncio.shield(self._replied)
            except TimeoutError:  # stuck (stopped, deadlocked): as TorchServe, replace it
                limit = self.runtime.response_timeout_s
                self._died(worker, f"no answer to a batch in {limit:.0f} s; killed")
                return

    async def _replies(self, worker: _Worker) -> None:
        """Read the worker's channel all the time: replies answer the batch in flight, and
        the end of the channel (the worker died, even while idle) is noticed at once."""
        try:
            while True:
                try:
                    payload = await _read_frame(worker.reader, self._reply_limit())
                except _FrameTooLargeError:
                    self._too_large()
                    continue
                if payload is None:
                    raise EOFError("the worker closed its channel")
                batch_id, results = protocol.decode_reply(payload)
                batch = self._inflight
                if batch_id != self._batch_id or len(results) != len(batch):
                    raise protocol.ProtocolError("a reply for another batch")
                self._inflight = []
                for pending, result in zip(batch, results, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(result)
                if self._replied is not None and not self._replied.done():
                    self._replied.set_result(None)
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.IncompleteReadError, protocol.ProtocolError, EOFError) as exc:
            self._died(worker, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    def _reply_limit(self) -> int:
        """The longest reply this instance reads: the batch in flight's answers at their cap."""
        per_result = self.runtime.max_answer_bytes + 0xFFFF + 8  # body, content type, head
        return 16 + max(1, len(self._inflight)) * per_result

    def _too_large(self) -> None:
        """The worker's reply was over :meth:`_reply_limit` (read past): its batch is 502."""
        batch, self._inflight = self._inflight, []
        limit = self.runtime.max_answer_bytes
        doc = {"code": 502, "type": "InternalServerException",
               "message": f"the model's answer was larger than {limit} bytes"}  # fmt: skip
        for pending in batch:
            if not pending.future.done():
                pending.future.set_result(Result(502, "application/json", json.dumps(doc).encode()))
        if self._replied is not None and not self._replied.done():
            self._replied.set_result(None)

    def _fail_all(self, reason: str) -> None:
        pending = [*self._inflight, *self.queue]
        self._inflight = []
        self.queue.clear()
        for p in pending:
            if not p.future.done():
                p.future.set_result(_gone(reason))

    def _died(self, worker: _Worker, reason: str) -> None:
        """The worker is gone: answer its requests now, then start another one."""
        if self.worker is not worker:
            return  # already handled (the reader and the batcher may both notice)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        lived = time.monotonic() - worker.started
        self.worker, self.status = None, "DEAD"
        self._fail_all("the instance's worker died; retry")
        log.warning("native: %s worker (pid %d) died after %.1f s: %s",
                    self.inst.name, worker.pid, lived, reason)  # fmt: skip
        self._failures = 0 if lived > STABLE_S else self._failures + 1
        self.runtime.on_death(self.inst.name)
        self._restart = asyncio.get_running_loop().create_task(self._finish_and_restart(worker))

    async def _finish_and_restart(self, dead: _Worker) -> None:
        await self._kill(dead)
        while not self._closing:
            wait = RESTART_BACKOFF_S[min(self._failures, len(RESTART_BACKOFF_S) - 1)]
            await asyncio.sleep(wait)
            if self._closing:
                return
            try:
                await self.start()
                return
            except (NativeStartError, ZygoteStartError, OSError) as exc:
                self._failures += 1
                log.warning("native: restarting %s failed: %s", self.inst.name, exc)

    async def _kill(self, worker: _Worker) -> None:
        worker.writer.close()
        if worker.owner is not None:  # the zygote kills the worker when this closes
            worker.owner.close()
        if worker.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()
            await asyncio.to_thread(worker.proc.wait)


class _FrameTooLargeError(protocol.ProtocolError):
    """A frame over the reader's limit: read past (dropped a chunk at a time, never held)."""


async def _read_frame(reader: asyncio.StreamReader, limit: int = 0) -> bytes | None:
    """The next frame's payload; None at the channel's end; :class:`_FrameTooLargeError`
    (after reading past it) when it is longer than ``limit``."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    length = protocol.frame_length(head)
    if limit and length > limit:
        while length:
            length -= len(await reader.readexactly(min(length, _DRAIN_CHUNK)))
        raise _FrameTooLargeError(f"a frame over {limit} bytes")
    return await reader.readexactly(length)


class NativeRuntime:
    """Native workers for a pod's plan instances (the backend contract, see the module)."""

    kind = "native"

    def __init__(
        self,
        *,
        workdir: Path,
        model_dir: Path,
        model_kind: str,  # "model" (zoo / TorchScript) or "mar"
        weights: Path | None,
        zygote: ZygoteProcess | None,
        max_batch_delay_ms: int,
        env: Mapping[str, str] | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
        response_timeout_s: float = RESPONSE_TIMEOUT_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.workdir = workdir
        self.max_answer_bytes = max_answer_bytes
        self.logdir = workdir / "native"
        self.model_dir = model_dir
        self.model_kind = model_kind
        self.weights = weights
        self.zygote = zygote
        self.max_batch_delay_s = max_batch_delay_ms / 1000.0
        self.env = {**os.environ, **(env or {})}
        self.load_timeout_s = load_timeout_s
        self.response_timeout_s = response_timeout_s
        self.instances: dict[str, NativeInstance] = {}
        # Told the name of an instance whose worker just died (the pod marks it down at once,
        # before its monitor's next look); the default does nothing.
        self.on_death: Callable[[str], None] = lambda _name: None
        # Told each batch sent to a worker: the instance's name and whether the batch was full
        # (else it left on the delay timeout); the pod counts them in its metrics.
        self.on_batch: Callable[[str, bool], None] = lambda _name, _full: None

    # -- the backend contract -----------------------------------------------------------------
    @property
    def running(self) -> bool:
        return True  # the runtime is this process; a dead worker is restarted, not fatal

    async def start(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)

    async def add(self, inst: InstanceSpec) -> None:
        """Start ``inst``'s worker and wait until it has loaded."""
        instance = NativeInstance(self, inst)
        self.instances[inst.name] = instance
        try:
            await instance.start()
        except BaseException:
            self.instances.pop(inst.name, None)
            await instance.close()
            raise

    async def remove(self, name: str) -> None:
        instance = self.instances.pop(name, None)
        if instance is not None:
            await instance.close()

    async def workers(self, name: str) -> list[WorkerState]:
        instance = self.instances.get(name)
        return [instance.state()] if instance is not None else []

    async def ping(self, *, timeout_s: float = 2.0) -> bool:
        return True  # no frontend between the dispatcher and the workers

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        instance = self.instances.get(name)
        if instance is None:
            return error_response(503, "instance unreachable", **{"Retry-After": "1"})
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        result = await instance.submit(Item(ctype, body))
        response = web.Response(status=result.status, body=result.body)
        response.headers["Content-Type"] = result.content_type or "application/json"
        if result.status == 503:
            response.headers["Retry-After"] = "1"
        return response

    async def stop(self) -> None:
        await asyncio.gather(*(self.remove(name) for name in list(self.instances)))

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.logdir.glob("*.log")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out += [f"{path.name}: {line}" for line in tail]
        return "\n".join(out[-lines:])

    # -- starting one worker ------------------------------------------------------------------
    def worker_args(self, inst: InstanceSpec, fd: int) -> list[str]:
        args = [
            "--fd", str(fd), "--name", inst.name, "--cpus", ",".join(map(str, inst.cpus)),
            "--threads", str(inst.threads), "--batch", str(inst.batch),
            "--kind", self.model_kind, "--model-dir", str(self.model_dir),
        ]  # fmt: skip
        if self.weights is not None:
            args += ["--weights", str(self.weights)]
        return args

    async def spawn(self, inst: InstanceSpec) -> _Worker:
        """A worker for ``inst``: forked from the zygote, or a fresh interpreter without one
        (or when the zygote cannot be reached)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # A batch's bodies in one write where the kernel allows (capped by net.core.wmem_max),
        # not a refill per 200 KB: on a busy node each refill waits for the dispatcher's turn.
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHANNEL_BUFFER_BYTES)
        log_path = self.logdir / f"{inst.name}.log"
        try:
            with log_path.open("ab") as out, open(os.devnull, "rb") as null:
                fds = [null.fileno(), out.fileno(), out.fileno(), theirs.fileno()]
                owner, proc, pid = None, None, 0
                if self.zygote is not None and self.zygote.running:
                    try:
                        owner, pid = await self.zygote.fork(
                            module=WORKER_MODULE, argv=self.worker_args(inst, 3), fds=fds,
                            env=self.env, cwd=self.workdir,
                        )  # fmt: skip
                    except ZygoteStartError as exc:
                        log.warning("native: %s: %s; starting a fresh interpreter", inst.name, exc)
                if owner is None:
                    cmd = [sys.executable, "-m", WORKER_MODULE,
                           *self.worker_args(inst, theirs.fileno())]  # fmt: skip
                    proc = subprocess.Popen(
                        cmd, stdin=null, stdout=out, stderr=out, pass_fds=(theirs.fileno(),),
                        env=self.env, cwd=self.workdir, start_new_session=True,
                    )  # fmt: skip
                    pid = proc.pid
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        return _Worker(pid=pid, reader=reader, writer=writer, owner=owner, proc=proc)
