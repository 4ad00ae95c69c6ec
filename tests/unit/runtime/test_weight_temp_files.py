"""Issue 38: a weight file's writer killed half-way leaves a temporary file; the next save
removes it at once (its writer's lock is gone), not 600 s later, so a crash-looping container
cannot fill /tmp with one model-sized file per restart. A live writer's file stays."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from packrat.runtime import weights  # noqa: E402


def _model() -> object:
    return torch.nn.Linear(4, 2)


def test_a_killed_writers_temp_file_goes_at_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "model.weights"
    left = tmp_path / "model.weightsabc123.tmp"
    left.write_bytes(b"x" * 4096)  # a killed writer's, written a moment ago
    weights._save(_model(), path)  # type: ignore[arg-type]
    assert path.exists() and not left.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.weights"]


def test_a_live_writers_temp_file_stays(tmp_path: Path) -> None:
    path = tmp_path / "model.weights"
    live = tmp_path / "model.weightslive.tmp"
    live.write_bytes(b"x")
    # another process writing it: it holds the file's lock until it is done
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,os;f=open(sys.argv[1],'ab');fcntl.flock(f,fcntl.LOCK_EX);"
            "print('locked',flush=True);sys.stdin.read()",
            str(live),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"locked\n"
        weights._save(_model(), path)  # type: ignore[arg-type]
        assert live.exists()
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait(10)
    with live.open("rb") as f:  # the lock went with its process
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
