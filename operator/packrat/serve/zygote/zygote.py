"""The pod's zygote: one process that imported torch and mapped the weights, forking workers.

Every TorchServe worker is its own Python process, and most of what one holds privately is
not the weights but the runtime: the interpreter's objects for torch and TorchServe's
modules and the relocated data of libtorch, rebuilt in every process. Started once per pod,
the zygote imports all of it, builds the model with its weights mapped from the pod's one
file (:mod:`packrat.runtime.weights`), and then forks a worker for each launcher that asks
(:mod:`packrat.serve.torchserve.worker_launcher`, which TorchServe runs as its "python"). A forked
worker shares those pages copy-on-write with the zygote and its siblings, and starts without
importing anything: it only pins itself and serves. When the pod's weight file is not there
yet, the zygote builds the model, writes the file and maps its own tensors from it: one
torch import and one build on the pod's start path, not two of each (a separate writer),
on cores the JVM needs too.

No intra-op thread pool may exist when the zygote forks (a forked OpenMP pool would hang):
it builds the model, when it must, with one thread, so that no pool is started, and checks
that; each worker sets its own threads after the fork, as before.
``python -m packrat.serve.zygote.zygote SOCKET [--model SPEC --weights FILE]
[--runtime torchserve|native]`` (what the workers run: :func:`worker_imports`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import importlib
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packrat.runtime.framing import recv_message

PR_SET_PDEATHSIG = 1
# What a TorchServe worker imports (its script, its service, the base handler, the loader).
TORCHSERVE_IMPORTS = (
    "ts.model_service_worker",
    "ts.service",
    "ts.torch_handler.base_handler",
    "ts.model_loader",
)
NATIVE_WORKER = "packrat.serve.native.worker"
RUNTIMES = ("torchserve", "native")


def worker_imports(runtime: str, model: str | None) -> tuple[str, ...]:
    """What the zygote imports before it forks, for the workers of ``runtime`` serving
    ``model``: TorchServe's worker; or the native worker, and TorchServe's model loader only
    for a user's .mar (whose handler it loads; a zoo model needs none of TorchServe)."""
    if runtime != "native":
        return TORCHSERVE_IMPORTS
    if model is not None and model.endswith(".mar"):
        return (NATIVE_WORKER, "ts.service", "ts.model_loader")
    return (NATIVE_WORKER,)


# When its steps ended (time.monotonic, which every process of the node shares), written to
# TIMELINE_FILE beside its socket before it listens: the pod's start-up timeline
# (packrat.serve.pod.timeline).
MARKS: dict[str, float] = {}
TIMELINE_FILE = "timeline.json"
WRITER_NAME = "packrat-weights"  # the process that writes the weight file behind the start

_MAX_FDS = 4  # stdin, stdout, stderr, and a native worker's channel to the pod


class ZygoteError(RuntimeError):
    """The zygote could not prepare the workers' model."""


class _Restart(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """Writing the weight file started threads: start afresh (the file is there now)."""


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(
    model: str | None,
    weights: Path | None,
    imports: Sequence[str] = TORCHSERVE_IMPORTS,
    *,
    write_behind: bool = False,
) -> Any:
    """Import torch and ``imports`` (what the pod's runtime runs in its workers:
    :func:`worker_imports`); write the pod's weight file unless it
    is there, and build the model on it once. Each step's time goes to the zygote's log.

    ``write_behind`` (the native runtime, whose workers are all forked from this process; a
    zoo model): the model built here is kept in this process's memory, which the forks share
    page by page as they would share the file's, and returned unwritten, for
    :func:`write_behind` to save once the pod is ready; otherwise (and when the file is
    there) returns None."""
    start = time.monotonic()
    import torch

    from packrat.serve import codec  # noqa: F401
    from packrat.serve.torchserve import handler

    for name in imports:
        importlib.import_module(name)
    MARKS["imported"] = time.monotonic()
    _note(f"imported torch and {', '.join(imports) or 'nothing else'}", start)
    if model is None or weights is None:
        return None
    start = time.monotonic()
    if weights.is_file():
        handler.preload_model(model, weights)
        MARKS["built"] = time.monotonic()
        _note(f"mapped {weights.name}", start)
        return None
    from packrat.runtime.modelid import is_zoo_name
    from packrat.runtime.weights import build_frozen, export_mapped

    # Only a zoo model is handed to the forks as built (a TorchScript file's workers map it).
    write_behind = write_behind and is_zoo_name(model)

    # Building the model runs torch operations, which must not leave a thread pool for the
    # forks to inherit: with one thread, at::parallel_for runs inline and starts none (each
    # worker sets its own threads after the fork). Checked, not assumed: if threads appeared
    # anyway, the zygote starts afresh and finds the file written.
    before, threads = _threads(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        built = build_frozen(model) if write_behind else export_mapped(model, weights)
    except Exception as exc:  # any failure: the pod's one clear error
        raise ZygoteError(f"cannot write {weights.name}: {type(exc).__name__}: {exc}") from None
    finally:
        torch.set_num_threads(threads)  # the default again; a pool starts only when used
    if _threads() > before:
        if write_behind:  # the restart must find the file, or it would build again
            _save_now(built, weights)
        raise _Restart
    handler.preload_model(model, weights, built=built)
    MARKS["built"] = time.monotonic()
    if write_behind:
        _note("built the model (its weight file is written behind)", start)
        return built
    _note(f"built the model, wrote and mapped {weights.name}", start)
    return None


def _save_now(built: Any, weights: Path) -> None:
    from packrat.runtime.weights import save

    try:
        save(built, weights)
    except Exception as exc:
        raise ZygoteError(f"cannot write {weights.name}: {type(exc).__name__}: {exc}") from None


def write_behind(built: Any, weights: Path) -> int:
    """Save ``built``'s weights to ``weights`` in a forked child at the lowest CPU priority
    (the pod asks once it is ready: :meth:`ZygoteProcess.write_weights`), so that the
    workers' forks and warm-up batches, not the write, have the pod's cores: the file is for
    what comes later (a restarted pod maps it instead of building, a worker started without
    the zygote loads it), not for these workers. Returns the child's pid; a failure only goes
    to the zygote's log (the workers do not need the file)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Its name in ps and /proc, so that it is never taken for a worker: set around the fork,
    # so that the child has it from its first instant (the zygote's own is put back).
    comm, own = Path("/proc/self/comm"), None
    with contextlib.suppress(OSError):
        own = comm.read_text().strip()
        comm.write_text(WRITER_NAME)
    pid = os.fork()
    if pid:
        with contextlib.suppress(OSError):
            if own is not None:
                comm.write_text(own)
        return pid
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):  # not the zygote's loop's handlers
            signal.signal(sig, signal.SIG_DFL)
        os.nice(19)
        start = time.monotonic()
        _save_now(built, weights)
        _note(f"wrote {weights.name} behind the start", start)
    except BaseException as exc:  # never return into the zygote's loop
        print(f"packrat zygote: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        os._exit(code)


def _note(what: str, start: float) -> None:
    print(f"packrat zygote: {what} in {time.monotonic() - start:.2f} s", flush=True)


def _child(
    request: dict[str, object],
    fds: Sequence[int],
    listener: socket.socket,
    inherited: Sequence[socket.socket],
) -> None:
    """In the forked worker: become the process TorchServe launched, then run its script (or
    a native worker's module). ``inherited``: the zygote's connections, not the worker's."""
    code = 1
    try:
        listener.close()
        for conn in inherited:
            conn.close()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # Out of the way first: a received descriptor may have a target's number.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
        for fd in fds:
            os.close(fd)
        for target, fd in enumerate(moved):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        env = {str(k): str(v) for k, v in dict(request["env"]).items()}  # type: ignore[call-overload]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(str(request["cwd"]))
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [p for p in extra if p not in sys.path]
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = argv
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        module = request.get("module")
        if isinstance(module, str):  # a native worker: its module's main(ARGS), imported already
            sys.argv = [module, *argv]
            code = int(importlib.import_module(module).main(argv) or 0)
        else:  # TorchServe's worker script
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a worker that fails must still exit, never return
        logging.basicConfig(stream=sys.stderr)
        logging.exception("zygote worker failed")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _answer_write(conn: socket.socket, fds: Sequence[int], write: Callable[[], int] | None) -> None:
    """The pod asks for the weight file (``{"op": "write_weights"}``): start writing it, once."""
    for fd in fds:
        os.close(fd)
    answer = b"none\n" if write is None else f"writing {write()}\n".encode()
    with contextlib.suppress(OSError):
        conn.sendall(answer)
    conn.close()


def serve(path: Path, write: Callable[[], int] | None = None) -> int:
    """Fork a worker per launcher connection until SIGTERM; kill a worker whose launcher
    went away; report each worker's exit status to its launcher. ``write``: starts writing
    the weight file when the pod asks (:func:`write_behind`), once."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # worker pid -> its launcher's connection
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = recv_message(conn, max_fds=_MAX_FDS)
                except (OSError, ValueError, ConnectionError):
                    conn.close()
                    continue
                if request.get("op") == "write_weights":
                    _answer_write(conn, fds, write)
                    write = None
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, listener, [conn, *children.values()])
                for fd in fds:
                    os.close(fd)
                if request.get("report_pid"):
                    with contextlib.suppress(OSError):
                        conn.sendall(f"pid {pid}\n".encode())
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a launcher's socket is readable: it closed, so its worker must go
                pid = key.data
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        while children:  # reap
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            done = children.pop(pid, None)
            if done is not None:
                conn = done
                sel.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
    for pid, conn in children.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        conn.close()
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.serve.zygote.zygote")
    parser.add_argument("socket", type=Path)
    parser.add_argument("--model")
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--runtime", choices=RUNTIMES, default="torchserve")
    args = parser.parse_args(argv)
    behind = args.runtime == "native"  # every worker is forked from here (no launcher)
    try:
        built = preload(
            args.model, args.weights, worker_imports(args.runtime, args.model), write_behind=behind
        )
    except ZygoteError as exc:
        print(f"packrat zygote: {exc}", file=sys.stderr)
        return 2
    except _Restart:
        print("packrat zygote: threads started while writing the weights; restarting", flush=True)
        argv = list(sys.argv[1:] if argv is None else argv)
        os.execv(sys.executable, [sys.executable, "-m", "packrat.serve.zygote.zygote", *argv])
    weights = args.weights
    write = None if built is None or weights is None else (lambda: write_behind(built, weights))
    _write_marks(args.socket.parent / TIMELINE_FILE)
    return serve(args.socket, write)


def _write_marks(path: Path) -> None:
    MARKS["listening"] = time.monotonic()
    with contextlib.suppress(OSError):  # a timeline is never worth failing the pod's start
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(MARKS))
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
