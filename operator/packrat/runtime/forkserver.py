"""A fork server: one process that paid for ``import torch`` and the model, forking workers.

Starting a model instance costs a Python interpreter, a torch import and a model build
(seconds; ResNet-50 on a busy core: 5-10 s), and a profile or a benchmark starts many
instances. The fork server pays that once: its owner starts it (:class:`ForkServer`), it
runs a ``preload`` step and then forks one worker per request, each with the pipes the owner
passes it as its stdin, stdout and stderr (``SCM_RIGHTS``). A worker shares the preloaded
pages copy-on-write and starts in milliseconds.

Honest isolation after a fork is the hard part, and why this module checks rather than
trusts:

- No thread pool may exist in the server when it forks: a forked OpenMP or BLAS pool is
  missing its threads in the child and hangs or misbehaves. The owner starts the server with
  one thread per runtime (:func:`packrat.runtime.pinning.thread_env` with 1), so the preload
  starts no pool, and the server counts its threads before every fork: more than one and the
  fork is refused with the reason.
- The worker pins itself and sets its thread counts before its first run (the ``child``
  callable's job: see :mod:`packrat.profiler.forked`), and reports its threads' affinities so
  that the owner can check them.

The channel is a Unix socket pair: the owner sends a length-prefixed JSON request with the
worker's three file descriptors; the server answers one JSON object (``{"pid": N}`` or
``{"error": ...}``). ``{"kill": pid}`` kills one of its workers (only its own, never a
recycled pid). When the owner closes the channel (or dies) the server kills its workers and
exits; workers die with the server (``PR_SET_PDEATHSIG``). Shared with the serving pod's
zygote (:mod:`packrat.serve.zygote`), which forks TorchServe's workers: the idea, and the
framing of the messages (:mod:`packrat.runtime.framing`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from packrat.runtime.framing import recv_message, send_message
from packrat.runtime.pinning import thread_env

__all__ = ["ForkServer", "ForkServerError", "OutputTail", "serve_forks", "thread_count"]

PR_SET_PDEATHSIG = 1
_STDIO = 3  # a worker's stdin, stdout and stderr


class ForkServerError(RuntimeError):
    """The fork server failed to start, refused a fork, or went away."""


def thread_count() -> int:
    """The number of threads this process runs now."""
    return len(os.listdir("/proc/self/task"))


# -- a child's output, kept for errors (the fork server's log, the profiler's workers' stderr) ---
class OutputTail:
    """The temporary file a child writes its output to, so that an error can quote its end
    (``file``; None where no temporary directory is writable, a read-only root file system
    without an emptyDir: the child inherits this process's output, the tail is empty)."""

    def __init__(self) -> None:
        self.file: IO[bytes] | None
        try:
            self.file = tempfile.TemporaryFile()  # noqa: SIM115 (lives with the child)
        except OSError:
            self.file = None

    def tail(self, limit: int = 2000) -> str:
        """The last ``limit`` bytes written, as text ("" without a file, or once closed)."""
        if self.file is None or self.file.closed:
            return ""
        self.file.flush()
        self.file.seek(0, os.SEEK_END)
        self.file.seek(max(0, self.file.tell() - limit))
        return self.file.read().decode(errors="replace").strip()

    def close(self) -> None:
        if self.file is not None and not self.file.closed:
            self.file.close()


# -- the server side ------------------------------------------------------------------------------
Child = Callable[[dict[str, Any]], int]


def _become_worker(request: dict[str, Any], fds: Sequence[int], channel: socket.socket,
                   child: Child) -> None:  # fmt: skip
    """In the forked process: take the passed stdio, run ``child``, never return."""
    code = 1
    try:
        channel.close()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        sys.stdin = os.fdopen(0, "r", buffering=1, closefd=False)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        code = child(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a worker that fails must still exit, never return to the loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve_forks(channel: socket.socket, child: Child, *, max_threads: int = 1) -> int:
    """Fork a worker per request on ``channel`` until it closes; returns the exit status.

    ``child(request)`` runs in each worker (its stdio already the passed descriptors) and
    returns the worker's exit status. A fork is refused while this process runs more than
    ``max_threads`` threads.
    """
    children: set[int] = set()

    def reap() -> None:
        while children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                return
            children.discard(pid)

    try:
        while True:
            ready, _, _ = select.select([channel], [], [], 0.5)
            reap()
            if not ready:
                continue
            try:
                request, fds = recv_message(channel, max_fds=_STDIO)
            except (ConnectionError, OSError, ValueError):
                return 0
            if "kill" in request:
                pid = int(request["kill"])
                if pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                send_message(channel, {"ok": True})
                continue
            threads = thread_count()
            if len(fds) != _STDIO or threads > max_threads:
                for fd in fds:
                    os.close(fd)
                why = (
                    f"{threads} threads run in the fork server (a thread pool was started "
                    "before the fork): a forked worker would inherit a broken pool"
                    if threads > max_threads
                    else f"expected {_STDIO} file descriptors, got {len(fds)}"
                )
                send_message(channel, {"error": why})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_worker(request, fds, channel, child)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            send_message(channel, {"pid": pid})
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            for _ in range(len(children)):
                os.waitpid(-1, 0)


def server_main(preload: Callable[[], dict[str, Any]], child: Child) -> int:
    """The fork server's entry point: ``preload()``, report ready, then :func:`serve_forks`.

    The channel is the descriptor named by ``PACKRAT_FORKSERVER_FD``; ``preload`` returns what
    the ready message carries (its times, for the owner's start-up accounting)."""
    fd = int(os.environ.pop("PACKRAT_FORKSERVER_FD"))
    channel = socket.socket(fileno=fd)
    began = time.monotonic()
    try:
        info = preload()
    except Exception as exc:  # the owner's one clear error
        import traceback

        traceback.print_exc()
        send_message(channel, {"event": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 1
    threads = thread_count()
    send_message(
        channel,
        {"event": "ready", "preload_s": time.monotonic() - began, "threads": threads, **info},
    )
    return serve_forks(channel, child)


# -- the owner's side -----------------------------------------------------------------------------
class ForkServer:
    """Start ``python -m <module> <args>`` as a fork server and ask it for workers."""

    def __init__(
        self, module: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None
    ) -> None:
        self.module = module
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.channel = ours
        self._log = OutputTail()
        child_env = dict(os.environ if env is None else env)
        child_env.update(thread_env(1))  # no pool in the server: see the module's docstring
        child_env["PACKRAT_FORKSERVER_FD"] = str(theirs.fileno())
        child_env["PYTHONUNBUFFERED"] = "1"
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log.file,
            stderr=self._log.file,
            env=child_env,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.ready: dict[str, Any] = {}
        self.startup_s = 0.0

    def wait_ready(self, *, timeout: float = 600.0) -> dict[str, Any]:
        """Until the preload is done: its ready message (raises with the log's tail)."""
        msg = self._reply(timeout=timeout, what="start")
        if msg.get("event") != "ready":
            self.close()
            raise ForkServerError(f"the fork server did not start: {msg.get('error', msg)}")
        self.ready = msg
        self.startup_s = time.monotonic() - self.started_at
        return msg

    def fork(self, request: Mapping[str, Any], stdio: Sequence[int], *,
             timeout: float = 60.0) -> int:  # fmt: skip
        """A new worker with ``stdio`` (stdin, stdout, stderr) running ``request``; its pid."""
        try:
            send_message(self.channel, request, stdio)
        except OSError as exc:
            raise ForkServerError(f"the fork server went away: {exc}{self._tail()}") from None
        msg = self._reply(timeout=timeout, what="fork")
        if "pid" not in msg:
            raise ForkServerError(f"fork refused: {msg.get('error', msg)}")
        return int(msg["pid"])

    def kill(self, pid: int) -> None:
        """Kill one worker of this server (a no-op for one that has exited)."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError, ForkServerError):
            send_message(self.channel, {"kill": pid})
            self._reply(timeout=10.0, what="kill")

    def _reply(self, *, timeout: float, what: str) -> dict[str, Any]:
        ready, _, _ = select.select([self.channel], [], [], timeout)
        if not ready:
            raise ForkServerError(f"the fork server did not answer ({what}) in {timeout:.0f} s")
        try:
            msg, _ = recv_message(self.channel)
        except (ConnectionError, OSError, ValueError) as exc:
            self.proc.wait(timeout=10)
            raise ForkServerError(
                f"the fork server exited ({self.proc.returncode}) during {what}: {exc}"
                + self._tail()
            ) from None
        return msg

    def _tail(self, limit: int = 2000) -> str:
        text = self._log.tail(limit)
        return f"\n--- fork server log ---\n{text}" if text else ""

    def close(self, *, timeout: float = 10.0) -> None:
        """Close the channel: the server kills its workers and exits (killed if it does not)."""
        with contextlib.suppress(OSError):
            self.channel.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
