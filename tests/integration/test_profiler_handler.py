"""Profiling through a model archive's handler: a user's .mar built by torch-model-archiver.

Real worker processes running TorchServe's own model loader on the archive; a handler whose
preprocessing sleeps 20 ms must shift every latency by at least that much (a sleep is a lower
bound, so this is a behaviour, not a timing race).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mar_support import build_mar

from packrat.plan.profile import load_profile
from packrat.profiler.client import HandlerTarget
from packrat.profiler.profiler import ProfileSettings, run_profile
from packrat.runtime.cpus import allowed_cpus

pytestmark = pytest.mark.integration

CPUS = allowed_cpus()
FAST = ProfileSettings(precision=0.2, point_budget_s=1.0, warmup=1, min_samples=3)


@pytest.fixture(scope="module")
def mars(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mars")
    (tmp / "sample.json").write_text(json.dumps([0.5] * 8))
    return {
        "plain": build_mar(tmp, "plain", 0.0),
        "sleepy": build_mar(tmp, "sleepy", 0.02),
        "sample": tmp / "sample.json",
    }


def _target(mars: dict[str, Path], which: str, workdir: Path) -> HandlerTarget:
    from packrat.serve.torchserve.archive import build_archive  # what `packrat profile` does

    archive = build_archive(str(mars[which]), workdir=workdir)
    return HandlerTarget(
        archive=archive.path, sample_request=mars["sample"], content_type="application/json"
    )


def test_a_20ms_preprocess_shifts_the_profile(mars: dict[str, Path], tmp_path: Path) -> None:
    results = {}
    for which in ("plain", "sleepy"):
        run = run_profile(
            spec=str(mars[which]),
            cpus=1,
            threads=[1],
            max_batch=2,
            output=tmp_path / f"{which}.json",
            settings=FAST,
            allowed=CPUS[:1],
            handler=_target(mars, which, tmp_path / which),
        )
        assert run.stopped == "complete" and not run.missing
        results[which] = load_profile(tmp_path / f"{which}.json")
    plain, sleepy = results["plain"], results["sleepy"]
    assert sleepy.meta.extra["through"] == "handler"
    assert sleepy.meta.extra["sample_request_sha256"].startswith("sha256:")
    assert sleepy.meta.model_digest != plain.meta.model_digest
    for b in (1, 2):
        low, high = plain.index[(1, b)], sleepy.index[(1, b)]
        assert high.p50_ms is not None and low.p50_ms is not None
        assert high.latency_ms >= 20.0  # the sleep is inside every measured batch
        assert high.p50_ms - low.p50_ms >= 15.0, (low, high)


def test_cli_profiles_a_mar_and_refuses_one_without_a_sample(
    mars: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "cli.json"
    base = [sys.executable, "-m", "packrat", "profile", "--model", str(mars["plain"])]
    grid = ["--cpus", "1", "--threads", "1", "--max-batch", "1", "--point-budget", "0.5"]
    refused = subprocess.run(
        [*base, *grid, "-o", str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert refused.returncode == 2
    assert "--sample-request" in refused.stderr and len(refused.stderr.splitlines()) == 1
    ok = subprocess.run(
        [
            *base,
            *grid,
            "--precision",
            "0.3",
            "--sample-request",
            str(mars["sample"]),
            "--sample-content-type",
            "application/json",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    profile = load_profile(out)
    assert profile.meta.extra["through"] == "handler"
    assert (1, 1) in profile.index
