"""A ``packrat serve`` pod as a real process for the integration tests: started with its
output in a log and waited on until ``/ping`` answers 200, stopped with SIGTERM; a loopback
file server (a model store) and a JSON request helper."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def ping_ok(url: str) -> bool:
    """Whether the pod at ``url`` answers ``/ping`` with 200 now."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def call_json(url: str, body: bytes | None = None, *, token: str | None = None) -> tuple[int, Any]:
    """GET (POST with ``body``) ``url``, with ``token`` as the bearer token when given:
    (status, JSON answer); (0, None) when unreachable."""
    method = "POST" if body is not None else "GET"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (urllib.error.URLError, OSError):
        return 0, None


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


def http_json(url: str, doc: Any = None, *, timeout: float = 30) -> tuple[int, Any]:
    """GET ``url`` (``doc`` None) or POST ``doc`` as JSON: (status, JSON answer or the error
    text; 0 when nothing answered)."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="GET" if doc is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)
