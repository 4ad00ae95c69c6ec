"""`packrat plan` on a profile of several engines: the label names the engine, fat is the
fastest fat engine, and an engine the profile left out is said once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROFILE = {
    "format": "packrat.profile/v2",
    "meta": {
        "model": "m",
        "cpus": 2,
        "mode": "co-located",
        "extra": {
            "engines": {
                "inductor": {"status": "excluded", "reason": "output 0 (float32): max |diff| 0.5"}
            }
        },
    },
    "points": [
        {"threads": 2, "batch": 8, "latency_ms": 100},
        {"threads": 1, "batch": 4, "latency_ms": 90},
        {"threads": 2, "batch": 8, "latency_ms": 80, "engine": "openvino"},
        {"threads": 1, "batch": 4, "latency_ms": 70, "engine": "openvino"},
    ],
}


def _plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE))
    return subprocess.run(
        [sys.executable, "-m", "packrat", "plan", "--profile", str(path), "--batch", "8", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_plan_table_names_the_engine(tmp_path: Path) -> None:
    out = _plan(tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2x1t/b4 openvino" in out.stdout
    assert "80.00 openvino" in out.stdout  # the fastest fat engine
    assert "engine inductor left out: output 0" in out.stdout


def test_plan_json_carries_the_engine(tmp_path: Path) -> None:
    out = _plan(tmp_path, "--format", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["engine"] == "openvino" and plan["label"] == "2x1t/b4 openvino"
    assert plan["fat_latency_ms"] == 80
