"""The parent's handle on a worker process (:mod:`packrat.profiler.worker`).

A worker is either a fresh process (:class:`WorkerProcess`: ``python -m
packrat.profiler.worker`` with the thread environment set before the interpreter starts) or
a process forked from a fork server that has the model built (:class:`ForkedWorker`, from
:class:`ForkedWorkers`): the same JSON-lines protocol either way. The parent reads replies
with timeouts (a hung or crashed worker is an error with the tail of its stderr, never a
hang of the profiler) and stops it. A :class:`WorkerSource` hands out workers of one kind,
so the profiler and the benchmarks run the same code over either.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import packrat
from packrat.runtime.cpus import format_cpu_list
from packrat.runtime.forkserver import ForkServer, ForkServerError, OutputTail
from packrat.runtime.pinning import thread_env

__all__ = [
    "EngineTarget",
    "ForkedWorker",
    "ForkedWorkers",
    "FreshWorkers",
    "HandlerTarget",
    "Worker",
    "WorkerError",
    "WorkerProcess",
    "WorkerSource",
    "worker_source",
]


class WorkerError(RuntimeError):
    """A worker failed to start, crashed, timed out or answered with an error."""


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(thread_env(threads))
    source_root = str(Path(packrat.__file__).resolve().parent.parent)
    paths = [source_root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True, slots=True)
class HandlerTarget:
    """Profile through a model archive's handler with one sample request (see worker)."""

    archive: Path
    sample_request: Path
    content_type: str = "application/octet-stream"

    def args(self) -> list[str]:
        return [
            "--archive",
            str(self.archive),
            "--sample-request",
            str(self.sample_request),
            "--content-type",
            self.content_type,
        ]


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """Run the instances on a converted engine (:mod:`packrat.runtime.engines`): its name and
    artefact, loaded by each worker after it pinned itself (after the fork, when forked)."""

    name: str
    artefact: Path | None = None

    def args(self) -> list[str]:
        return ["--engine", self.name] + (
            ["--artefact", str(self.artefact)] if self.artefact is not None else []
        )


def _engine_args(engine: EngineTarget | None) -> list[str]:
    return engine.args() if engine is not None else []


class Worker:
    """One pinned model instance in another process, spoken to over its stdin and stdout."""

    def __init__(self, *, spec: str, cpus: Sequence[int], threads: int) -> None:
        self.spec = spec
        self.cpus = sorted(cpus)
        self.threads = threads
        self._stderr = OutputTail()  # the worker's stderr, quoted in errors
        self._buffer = b""
        self._stdin: IO[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self.started_at = time.monotonic()
        self.startup_s = 0.0
        self.ready: dict[str, Any] = {}

    # -- lifecycle (per kind) --------------------------------------------------------------------
    def alive(self) -> bool:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def _wait_exit(self, timeout: float) -> bool:
        """After ``exit``: True when the worker exited within ``timeout``."""
        raise NotImplementedError

    def _exited(self) -> str:
        return "exited"

    # -- lifecycle ---------------------------------------------------------------------------
    def wait_ready(self, *, timeout: float = 300.0) -> dict[str, Any]:
        """Block until the worker has pinned itself and loaded the model."""
        msg = self.recv(timeout=timeout)
        if msg.get("event") != "ready":
            raise self._error(f"did not start: {msg.get('error', msg)}")
        self.ready = msg
        self.startup_s = time.monotonic() - self.started_at
        return msg

    def close(self, *, timeout: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive():
            try:
                self.send({"cmd": "exit"})
                if not self._wait_exit(timeout):
                    self.kill()
            except (OSError, WorkerError):
                self.kill()
        self._cleanup()

    def _cleanup(self) -> None:
        for stream in (self._stdin, self._stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._stderr.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        stdin = self._stdin
        if stdin is None or stdin.closed:
            raise self._error("stdin is closed")
        try:
            stdin.write((json.dumps(msg) + "\n").encode())
            stdin.flush()
        except OSError as exc:
            raise self._error(f"cannot send {msg.get('cmd')!r}: {exc}") from None

    def recv(self, *, timeout: float) -> dict[str, Any]:
        msg = self._recv(timeout=timeout, block=True)
        assert msg is not None
        return msg

    def poll(self) -> dict[str, Any] | None:
        """A reply that has arrived, or None (never blocks)."""
        return self._recv(timeout=0.0, block=False)

    def _recv(self, *, timeout: float, block: bool) -> dict[str, Any] | None:
        stdout = self._stdout
        if stdout is None:
            raise self._error("no stdout")
        deadline = time.monotonic() + timeout
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 and block:
                self.kill()
                raise WorkerError(f"worker {self.describe()} did not answer within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], max(left, 0.0))
            if not ready:
                if not block:
                    return None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._error(self._exited())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        msg: dict[str, Any] = json.loads(line)
        if "error" in msg and msg.get("event") != "failed":
            raise self._error(str(msg["error"]))
        return msg

    def request(self, msg: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        self.send(msg)
        return self.recv(timeout=timeout)

    # -- diagnostics -------------------------------------------------------------------------
    def describe(self) -> str:
        return f"{self.spec} t={self.threads} cpus={format_cpu_list(self.cpus)}"

    def stderr_tail(self, limit: int = 2000) -> str:
        return self._stderr.tail(limit)

    def _error(self, what: str) -> WorkerError:
        tail = self.stderr_tail()
        return WorkerError(
            f"worker {self.describe()} {what}"
            + (f"\n--- worker stderr ---\n{tail}" if tail else "")
        )


class WorkerProcess(Worker):
    """One pinned model instance in a fresh child process (``python -m ...worker``)."""

    def __init__(
        self,
        *,
        spec: str,
        cpus: Sequence[int],
        threads: int,
        handler: HandlerTarget | None = None,
        engine: EngineTarget | None = None,
    ) -> None:
        super().__init__(spec=spec, cpus=cpus, threads=threads)
        cmd = [
            sys.executable,
            "-m",
            "packrat.profiler.worker",
            "--model",
            spec,
            "--cpus",
            format_cpu_list(self.cpus),
            "--threads",
            str(threads),
            *(handler.args() if handler is not None else []),
            *_engine_args(engine),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr.file,
            env=_child_env(threads),
        )
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout

    @classmethod
    def start(
        cls,
        *,
        spec: str,
        cpus: Sequence[int],
        threads: int,
        timeout: float = 300.0,
        handler: HandlerTarget | None = None,
    ) -> WorkerProcess:
        worker = cls(spec=spec, cpus=cpus, threads=threads, handler=handler)
        try:
            worker.wait_ready(timeout=timeout)
        except BaseException:
            worker.kill()
            raise
        return worker

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _wait_exit(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _exited(self) -> str:
        self.proc.wait()
        return f"exited with status {self.proc.returncode}"


class ForkedWorker(Worker):
    """One pinned model instance forked from a :class:`ForkedWorkers` server."""

    def __init__(self, server: ForkServer, *, spec: str, cpus: Sequence[int], threads: int) -> None:
        super().__init__(spec=spec, cpus=cpus, threads=threads)
        self.server = server
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err = self._stderr.file.fileno() if self._stderr.file is not None else 2
        try:
            self.pid = server.fork({"cpus": self.cpus, "threads": threads}, [in_r, out_w, err])
        except ForkServerError as exc:
            os.close(in_w)
            os.close(out_r)
            raise self._error(str(exc)) from None
        finally:  # the worker's ends: it has its own copies now
            os.close(in_r)
            os.close(out_w)
        self._stdin = os.fdopen(in_w, "wb")
        self._stdout = os.fdopen(out_r, "rb")
        self._eof = False

    def alive(self) -> bool:
        return not self._eof and self._stdout is not None and not self._stdout.closed

    def _wait_exit(self, timeout: float) -> bool:
        """Until the worker's stdout closes (it exited), replies drained."""
        deadline = time.monotonic() + timeout
        stdout = self._stdout
        assert stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([stdout.fileno()], [], [], left)
            if ready and not os.read(stdout.fileno(), 65536):
                self._eof = True
                return True

    def kill(self) -> None:
        if self.alive():
            self.server.kill(self.pid)
        self._eof = True
        self._cleanup()


class WorkerSource(Protocol):
    """Hands out workers of one kind for one model (and handler)."""

    kind: str  # "fresh" | "forked"
    startup_s: float  # one-time start-up (the fork server's), in seconds

    def start(self) -> None: ...

    def spawn(self, *, cpus: Sequence[int], threads: int) -> Worker: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class FreshWorkers:
    """A fresh process per worker: its own torch import and model build."""

    spec: str
    handler: HandlerTarget | None = None
    kind: str = "fresh"
    startup_s: float = 0.0
    engine: EngineTarget | None = None

    def start(self) -> None:
        return None

    def spawn(self, *, cpus: Sequence[int], threads: int) -> Worker:
        return WorkerProcess(
            spec=self.spec, cpus=cpus, threads=threads, handler=self.handler, engine=self.engine
        )

    def close(self) -> None:
        return None


@dataclass(slots=True)
class ForkedWorkers:
    """Workers forked from one fork server that imported torch and built the model once
    (:mod:`packrat.profiler.forked`)."""

    spec: str
    handler: HandlerTarget | None = None
    startup_timeout_s: float = 600.0
    kind: str = "forked"
    startup_s: float = 0.0
    server: ForkServer | None = None
    engine: EngineTarget | None = None

    def start(self) -> None:
        if self.server is not None:
            return
        args = [
            "--model",
            self.spec,
            *(self.handler.args() if self.handler else []),
            *_engine_args(self.engine),
        ]
        server = ForkServer("packrat.profiler.forked", args, env=_child_env(1))
        try:
            server.wait_ready(timeout=self.startup_timeout_s)
        except ForkServerError as exc:
            raise WorkerError(f"{self.spec}: {exc}") from None
        self.server = server
        self.startup_s = server.startup_s

    def spawn(self, *, cpus: Sequence[int], threads: int) -> Worker:
        self.start()
        assert self.server is not None
        return ForkedWorker(self.server, spec=self.spec, cpus=cpus, threads=threads)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


PROCESS_KINDS = ("forked", "fresh")


def worker_source(
    kind: str,
    spec: str,
    handler: HandlerTarget | None = None,
    engine: EngineTarget | None = None,
) -> WorkerSource:
    """Workers of ``kind`` ("forked", the default, or "fresh") for ``spec`` (on ``engine``)."""
    if kind == "forked":
        return ForkedWorkers(spec, handler, engine=engine)
    if kind == "fresh":
        return FreshWorkers(spec, handler, engine=engine)
    raise ValueError(f"unknown worker kind {kind!r} (known: {', '.join(PROCESS_KINDS)})")
