"""The GPU measurement script (benchmarks/gpu/ignite_gpu.py) end to end on the CPU stand-in:
every step a device run takes except the CUDA calls, in a real process, in seconds. No timing
assertions: the stand-in's times mean nothing; its outputs, counts and budget do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "ignite_gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_help_says_which_figures_it_makes() -> None:
    done = _run("--help")
    assert done.returncode == 0
    assert "load-then-run" in done.stdout and "LCache" in done.stdout and "P99" in done.stdout


def test_dry_run_exercises_every_step_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "dry.json"
    done = _run("--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    cold = result["cold_starts"]
    assert {(r["model"], r["batch"]) for r in cold} == {
        (m, b) for m in ("resnet50", "bert-base", "gpt2") for b in (1, 8)
    }
    for r in cold:
        assert r["output_mismatches"] == 0
        assert set(r["latency"]) == {
            "warm_plain",
            "warm_staged",
            "warm_dha",
            "load_then_run",
            "pipelined",
            "pipelined_dha",
        }
        assert len(r["dha_placements"]) == r["stages"] == len(r["profile"])
    pools = result["pool"]["pools"]
    assert set(pools) == {"lcache", "lcache_pipelined", "lru_load_then_run", "lru_pipelined"}
    for p in pools.values():
        assert p["failed"] == 0 and p["output_mismatches"] == 0 and p["within_budget"]
    assert set(result["pool"]["predicted"]) == {"lcache", "lru_load_then_run"}
    assert pools["lru_load_then_run"]["cold_requests"] > 0  # the budget does not hold every model


def test_cuda_asked_for_without_a_gpu_is_one_clear_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the refusal without one")
    done = _run("--device", "cuda", "--skip-pool", "--models", "gpt2")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "CUDA is not available" in done.stderr
