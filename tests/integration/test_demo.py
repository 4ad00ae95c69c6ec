"""``packrat demo`` runs the whole local workflow (profile -> plan -> bench) for real, on a
quiet machine and on one whose cores are kept busy by another process (issue 37 item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# a spin loop that stops by itself: bounded even if the test is killed before it cleans up
BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _demo(out: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "packrat", "demo", "--model", "tiny", "--batch", "2,4",
         "--point-budget", "0.5", "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _profile(out: Path) -> dict[str, object]:
    profiles = list(out.glob("tiny-*cpu.json"))
    assert len(profiles) == 1
    data: dict[str, object] = json.loads(profiles[0].read_text())
    return data


@contextmanager
def busy_cores(seconds: float) -> Iterator[list[int]]:
    """One CPU burner pinned to each core this process may use, at this process's priority
    (the profiler's calibration shares the core with it fairly), each stopping by itself
    after ``seconds`` and killed when the block ends."""
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    try:
        for core in cores:
            proc = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)])
            os.sched_setaffinity(proc.pid, {core})
            procs.append(proc)
        yield cores
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def test_demo_with_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = _demo(out, timeout=480)
    assert result.returncode == 0, result.stderr[-3000:]
    data = _profile(out)
    assert data["meta"]["model"] == "tiny"  # type: ignore[index]
    points = data["points"]
    assert {(p["threads"], p["batch"]) for p in points} >= {(1, 2), (1, 4)}  # type: ignore[attr-defined]
    assert (out / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert "actual/exp" in result.stdout  # the bench table was printed
    # the progress records are for the operator's log reader, not for a person
    assert "packrat-progress" not in result.stdout + result.stderr


def test_demo_on_busy_cores_goes_on_and_says_so(tmp_path: Path) -> None:
    """Both cores busy (the issue: 'refusing to store a contaminated profile', exit 2): the demo
    keeps the profile, marks it contended, says so prominently, and still measures the plans
    against the fat instance side by side."""
    out = tmp_path / "demo"
    with busy_cores(seconds=600):
        result = _demo(out, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = _profile(out)["meta"]
    extra = meta["extra"]  # type: ignore[index]
    assert extra["isolation"]["contaminated"] is True, extra["isolation"]
    assert extra["contended"] is True
    assert extra["isolation"]["allow_contended"] is True
    # the banner, before the plans and again at the end, with the isolation check's reasons
    assert result.stdout.count("!! BUSY CORES") == 2, result.stdout[-3000:]
    assert result.stdout.index("!! BUSY CORES") < result.stdout.index("== 2/3")
    assert "busy core" in result.stdout
    assert "actual/exp" in result.stdout  # plan vs fat, measured side by side
    assert "packrat-progress" not in result.stdout + result.stderr
