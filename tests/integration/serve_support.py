"""A ``packrat serve`` pod as a real process for the integration tests: started with its
output in a log and waited on until ``/ping`` answers 200, stopped with SIGTERM; a loopback
file server (a model store)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def ping_ok(url: str) -> bool:
    """Whether the pod at ``url`` answers ``/ping`` with 200 now."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start_serving(
    cmd: list[str], url: str, log: Path, *, ready_s: float = 300
) -> subprocess.Popen[bytes]:
    """Runs ``cmd`` (its output in ``log``) until the pod at ``url`` is ready; a pod that exits
    or is not ready within ``ready_s`` is killed, and the test fails with its log."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ready_s
    while not ping_ok(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"pod not ready:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    return proc


def stop_serving(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, and the exit code within 60 s (killed if it is still running then)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def file_server(folder: Path) -> Iterator[str]:
    """A plain HTTP server on loopback publishing ``folder``'s files: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
