"""A ``packrat serve`` pod as a real process for the integration tests: started with its
output in a log and waited on until ``/ping`` answers 200, stopped with SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def ping_ok(url: str) -> bool:
    """Whether the pod at ``url`` answers ``/ping`` with 200 now."""
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def call_json(url: str, body: bytes | None = None) -> tuple[int, Any]:
    """GET (POST with ``body``) ``url``: (status, JSON answer); (0, None) when unreachable."""
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
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
