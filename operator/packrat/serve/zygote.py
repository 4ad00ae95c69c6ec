"""The pod's zygote: one process that imported torch and mapped the weights, forking workers.

Every TorchServe worker is its own Python process, and most of what one holds privately is
not the weights but the runtime: the interpreter's objects for torch and TorchServe's
modules and the relocated data of libtorch, rebuilt in every process. Started once per pod,
the zygote imports all of it, builds the model with its weights mapped from the pod's one
file (:mod:`packrat.runtime.weights`), and then forks a worker for each launcher that asks
(:mod:`packrat.serve.worker_launcher`, which TorchServe runs as its "python"). A forked
worker shares those pages copy-on-write with the zygote and its siblings, and starts without
importing anything: it only pins itself and serves.

The zygote never runs a torch operation, so no intra-op thread pool exists when it forks
(a forked OpenMP pool would hang); each worker sets its own threads after the fork, as
before. ``python -m packrat.serve.zygote SOCKET [--model SPEC --weights FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
_MAX_REQUEST = 1 << 20


def preload(model: str | None, weights: Path | None, *, wait_s: float = 600.0) -> None:
    """Import what every worker imports; build the model once when it has a weight file."""
    import torch  # noqa: F401
    import ts.model_service_worker
    import ts.service
    import ts.torch_handler.base_handler  # noqa: F401

    from packrat.serve import codec, handler  # noqa: F401

    if model is None or weights is None:
        return
    deadline = time.monotonic() + wait_s
    while not weights.is_file():  # the pod writes it while TorchServe starts
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    handler.preload_model(model, weights)


def _recv_request(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 4 + _MAX_REQUEST, 3)
    size = int.from_bytes(head[:4], "big")
    body = head[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("launcher went away")
        body += chunk
    return json.loads(body), list(fds)


def _child(request: dict[str, object], fds: Sequence[int], listener: socket.socket) -> None:
    """In the forked worker: become the process TorchServe launched, then run its script."""
    code = 1
    try:
        listener.close()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for target, fd in enumerate(fds):
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
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a worker that fails must still exit, never return
        logging.basicConfig(stream=sys.stderr)
        logging.exception("zygote worker failed")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(path: Path) -> int:
    """Fork a worker per launcher connection until SIGTERM; kill a worker whose launcher
    went away; report each worker's exit status to its launcher."""
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
                    request, fds = _recv_request(conn)
                except (OSError, ValueError, ConnectionError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, listener)
                for fd in fds:
                    os.close(fd)
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
    parser = argparse.ArgumentParser(prog="python -m packrat.serve.zygote")
    parser.add_argument("socket", type=Path)
    parser.add_argument("--model")
    parser.add_argument("--weights", type=Path)
    args = parser.parse_args(argv)
    preload(args.model, args.weights)
    return serve(args.socket)


if __name__ == "__main__":
    sys.exit(main())
