"""Issue 38: a leaking handler had no memory limit: its worker grew until the kernel killed
the whole container. The pod's watchdog kills the largest worker once the pod's private memory
passes a fraction of the container's limit; here a real process that leaks 96 MiB is the
worker, under a 100 MiB "limit"."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from packrat.serve.pod.memory import container_memory_limit, reclaim, rss_anon, to_reclaim

LEAK = 96 << 20


@pytest.fixture()
def leaker() -> Iterator[subprocess.Popen[bytes]]:
    code = f"b = bytearray({LEAK}); b[::4096] = b'x' * ({LEAK} // 4096); print('ok', flush=True)"
    code += "; input()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_the_largest_worker_goes_past_the_fraction(leaker: subprocess.Popen[bytes]) -> None:
    assert rss_anon(leaker.pid) >= LEAK
    small = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    try:
        pids = {"m_i0": small.pid, "m_i1": leaker.pid}
        assert reclaim(pids, limit=100 << 30) is None  # far from a 100 GiB limit: nothing
        assert reclaim(pids, limit=None) is None  # no limit: nothing to protect
        assert reclaim(pids, limit=100 << 20) == "m_i1"
        assert leaker.wait(10) == -9 and small.poll() is None
    finally:
        small.kill()
        small.wait(10)


def test_to_reclaim_is_pure() -> None:
    assert to_reclaim({"a": 10, "b": 50}, own=5, limit=100) is None
    assert to_reclaim({"a": 10, "b": 80}, own=5, limit=100) == "b"
    assert to_reclaim({}, own=500, limit=100) is None


def test_the_limit_is_the_cgroups(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    assert container_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("4294967296\n")
    assert container_memory_limit(tmp_path) == 4 << 30
    assert container_memory_limit(tmp_path / "absent") is None
