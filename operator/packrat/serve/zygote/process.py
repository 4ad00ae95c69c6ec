"""The pod's side of the zygote: start it, write the "python" TorchServe runs, stop it.

:class:`ZygoteProcess` starts ``python -m packrat.serve.zygote.zygote`` (it imports torch and maps
the weights while TorchServe's JVM starts) and writes a two-line shell script that
TorchServe is given as its workers' interpreter: it runs
:mod:`packrat.serve.torchserve.worker_launcher` without site-packages, which asks the zygote for a
forked worker (or runs the real interpreter when the zygote cannot be reached).

The zygote is the longest part of a pod's start (importing torch, writing the weight
file), so ``packrat serve`` starts it first, before it imports the serving stack
(:func:`prestart`; this module and its imports stay light for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from packrat.runtime.framing import send_message
from packrat.serve.torchserve import worker_launcher
from packrat.serve.zygote.shared_weights import shared_weights_file
from packrat.serve.zygote.zygote import NATIVE_WORKER, TIMELINE_FILE, worker_imports

SUBDIR = "zygote"


__all__ = ["NATIVE_WORKER", "ZygoteProcess", "ZygoteStartError", "prestart", "worker_imports"]


class ZygoteStartError(RuntimeError):
    """The zygote exited, or took too long, before it could fork workers."""


class ZygoteProcess:
    """One zygote for one pod."""

    def __init__(
        self,
        workdir: Path,
        *,
        model: str,
        weights: Path | None,
        runtime: str = "torchserve",
    ) -> None:
        self.workdir = workdir
        self.runtime = runtime  # what the workers run (the zygote imports it before forking)
        self.dir = workdir / SUBDIR
        self.socket = self.dir / "zygote.sock"
        self.python = self.dir / "python"
        self.model = model
        self.weights = weights
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None  # when start() spawned it (time.monotonic)

    def write_launcher(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        real = shlex.quote(sys.executable)
        script = shlex.quote(str(Path(worker_launcher.__file__).resolve()))
        sock = shlex.quote(str(self.socket))
        self.python.write_text(f'#!/bin/sh\nexec {real} -S -E {script} {real} {sock} "$@"\n')
        self.python.chmod(0o700)
        return self.python

    def start(self) -> Path:
        """Start the zygote (once); returns the interpreter path to hand to TorchServe."""
        if self.proc is not None:
            return self.python
        path = self.write_launcher()
        self.socket.unlink(missing_ok=True)  # a previous run's: wait_ready waits for ours
        (self.dir / TIMELINE_FILE).unlink(missing_ok=True)  # and its timeline
        args = [sys.executable, "-m", "packrat.serve.zygote.zygote", str(self.socket)]
        if self.weights is not None:
            args += ["--model", self.model, "--weights", str(self.weights)]
        args += ["--runtime", self.runtime]
        self.started_at = time.monotonic()
        with (self.dir / "zygote.log").open("wb") as log:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its workers never share the pod's process group
            )
        return path

    def log_tail(self, lines: int = 3) -> str:
        """The log's last lines, on one line (the zygote's own message is the last)."""
        try:
            text = (self.dir / "zygote.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    async def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Until the zygote listens (it has written the weight file and built the model), or
        a :class:`ZygoteStartError` with its log when it exits first."""
        deadline = time.monotonic() + timeout_s
        while not self.socket.exists():
            proc = self.proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ZygoteStartError(f"the zygote exited ({code}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise ZygoteStartError(f"the zygote was not ready after {timeout_s:.0f} s")
            # Every instance waits here for the forks: 10 ms, not 50 (half a poll was 25 ms
            # of the pod's start on average, beside 2 ms of CPU for the polls of a 1-2 s wait).
            await asyncio.sleep(0.01)

    def marks(self) -> dict[str, float]:
        """When the zygote's steps ended (``imported``, ``built``, ``listening``, on
        ``time.monotonic``), from the file it wrote before it listened; none when that is
        missing or malformed (a timeline is never worth failing a start)."""
        try:
            with (self.dir / TIMELINE_FILE).open("rb") as f:
                doc = json.loads(f.read(4096))  # a few numbers
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict):
            return {}
        return {
            str(k): float(v)
            for k, v in doc.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def fork(
        self,
        *,
        module: str,
        argv: Sequence[str],
        fds: Sequence[int],
        env: Mapping[str, str],
        cwd: Path,
        timeout_s: float = 10.0,
    ) -> tuple[socket.socket, int]:
        """A worker forked from the zygote running ``python -m module argv``, with ``fds`` as
        its descriptors 0, 1, 2, ...; returns the connection that owns it (closing it kills
        the worker; the zygote writes ``exit N`` on it when the worker exits) and its pid."""
        request = {
            "argv": list(argv),
            "module": module,
            "cwd": str(cwd),
            "env": dict(env),
            "report_pid": True,
        }

        def ask() -> tuple[socket.socket, int]:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(str(self.socket))
                send_message(sock, request, fds)
                line = b""
                while not line.endswith(b"\n") and len(line) < 64:
                    chunk = sock.recv(1)
                    if not chunk:
                        raise ZygoteStartError("the zygote closed the connection before forking")
                    line += chunk
                word, _, pid = line.decode().partition(" ")
                if word != "pid":
                    raise ZygoteStartError(f"the zygote answered {line!r}")
                sock.settimeout(None)
                return sock, int(pid)
            except BaseException:
                sock.close()
                raise

        try:
            return await asyncio.to_thread(ask)
        except OSError as exc:
            raise ZygoteStartError(f"cannot reach the zygote: {exc}") from None

    async def write_weights(self, timeout_s: float = 10.0) -> str:
        """Ask the zygote to write the weight file now, if it kept it for later (the native
        runtime's zygote: :func:`packrat.serve.zygote.zygote.write_behind`); its answer
        (``writing PID`` or ``none``). Called once the pod is ready."""

        def ask() -> str:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(str(self.socket))
                send_message(sock, {"op": "write_weights"})
                return sock.recv(64).decode(errors="replace").strip()

        try:
            return await asyncio.to_thread(ask)
        except OSError as exc:
            raise ZygoteStartError(f"cannot reach the zygote: {exc}") from None

    async def stop(self, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self.stop_now, timeout_s)

    def stop_now(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; its workers die with it (PDEATHSIG)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def prestart(
    model: str, workdir: Path, *, shared_weights: bool = True, runtime: str = "torchserve"
) -> ZygoteProcess:
    """Start a pod's zygote now, for :class:`packrat.serve.pod.server.ServeOptions`
    ``zygote_process``
    (``packrat serve`` calls it before importing the serving stack)."""
    weights = shared_weights_file(model, workdir, enabled=shared_weights)
    zygote = ZygoteProcess(workdir, model=model, weights=weights, runtime=runtime)
    zygote.start()
    return zygote
