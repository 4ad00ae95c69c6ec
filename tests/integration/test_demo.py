"""``packrat demo`` runs the whole local workflow (profile -> plan -> bench) for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_with_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "packrat", "demo", "--model", "tiny", "--batch", "2,4",
         "--point-budget", "0.5", "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    profiles = list(out.glob("tiny-*cpu.json"))
    assert len(profiles) == 1
    data = json.loads(profiles[0].read_text())
    assert data["meta"]["model"] == "tiny"
    assert {(p["threads"], p["batch"]) for p in data["points"]} >= {(1, 2), (1, 4)}
    assert (out / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert "actual/exp" in result.stdout  # the bench table was printed
