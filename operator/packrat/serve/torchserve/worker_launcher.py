"""What TorchServe runs as "python" for a worker: ask the pod's zygote for a forked one.

Run as ``python -S -E worker_launcher.py REAL_PYTHON SOCKET ARGS...`` (standard library only,
no site-packages: a few MB, a few ms). It connects to the zygote's Unix socket
(:mod:`packrat.serve.zygote.zygote`), hands over its stdin, stdout and stderr (``SCM_RIGHTS``), its
arguments, working directory and environment, and waits: the zygote forks a worker that
already imported torch and mapped the weights, runs TorchServe's worker script in it with
those descriptors, and reports its exit status, which the launcher exits with. When the
launcher dies (TorchServe stops the worker), the zygote sees the socket close and kills the
forked worker. Anything that is not a TorchServe worker, or a zygote that cannot be
reached in time, falls back to executing the real interpreter, so a worker always starts.
"""

import json
import os
import socket
import sys
import time

CONNECT_WAIT_S = 60.0


def _fallback(real: str, args: list[str]) -> None:
    os.execv(real, [real, *args])


def main() -> None:
    real, path, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if not args or not args[0].endswith("model_service_worker.py"):
        _fallback(real, args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            sock.connect(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                sock.close()
                _fallback(real, args)
            time.sleep(0.01)  # a failed connect costs microseconds; the zygote is near
    request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(sock, [len(request).to_bytes(4, "big") + request], [0, 1, 2])
    answer = b""
    while True:
        chunk = sock.recv(64)
        if not chunk:
            break
        answer += chunk
    try:
        code = int(answer.decode().split()[-1])
    except (ValueError, IndexError):
        code = 1  # the zygote went away: the worker is gone too
    sys.exit(code)


if __name__ == "__main__":
    main()
