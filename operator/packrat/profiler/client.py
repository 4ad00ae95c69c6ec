"""The parent's handle on a worker process (:mod:`packrat.profiler.worker`).

Starts ``python -m packrat.profiler.worker`` with the thread environment set before the
interpreter starts, reads its JSON-lines replies with timeouts (a hung or crashed worker is
an error with the tail of its stderr, never a hang of the profiler), and stops it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import packrat
from packrat.runtime.cpus import format_cpu_list
from packrat.runtime.pinning import thread_env

__all__ = ["HandlerTarget", "WorkerError", "WorkerProcess"]


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


class WorkerProcess:
    """One pinned model instance in a child process."""

    def __init__(
        self,
        *,
        spec: str,
        cpus: Sequence[int],
        threads: int,
        handler: HandlerTarget | None = None,
    ) -> None:
        self.spec = spec
        self.cpus = sorted(cpus)
        self.threads = threads
        # The worker's stderr goes to a temp file, quoted in errors; where no temp dir is
        # writable (read-only root file system without an emptyDir) it is inherited.
        self._stderr: IO[bytes] | None
        try:
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives with the worker)
        except OSError:
            self._stderr = None
        self._buffer = b""
        self.started_at = time.monotonic()
        self.ready: dict[str, Any] = {}
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
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=_child_env(threads),
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def wait_ready(self, *, timeout: float = 300.0) -> dict[str, Any]:
        """Block until the worker has pinned itself and loaded the model."""
        msg = self.recv(timeout=timeout)
        if msg.get("event") != "ready":
            raise self._error(f"did not start: {msg.get('error', msg)}")
        self.ready = msg
        self.startup_s = time.monotonic() - self.started_at
        return msg

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

    def close(self, *, timeout: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "exit"})
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired, WorkerError):
                self.kill()
        self._cleanup()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            raise self._error("stdin is closed")
        try:
            stdin.write((json.dumps(msg) + "\n").encode())
            stdin.flush()
        except OSError as exc:
            raise self._error(f"cannot send {msg.get('cmd')!r}: {exc}") from None

    def recv(self, *, timeout: float) -> dict[str, Any]:
        stdout = self.proc.stdout
        if stdout is None:
            raise self._error("no stdout")
        deadline = time.monotonic() + timeout
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerError(f"worker {self.describe()} did not answer within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise self._error(f"exited with status {self.proc.returncode}")
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
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - limit))
        return self._stderr.read().decode(errors="replace").strip()

    def _error(self, what: str) -> WorkerError:
        tail = self.stderr_tail()
        return WorkerError(
            f"worker {self.describe()} {what}"
            + (f"\n--- worker stderr ---\n{tail}" if tail else "")
        )
