"""``packrat bench --serving`` end to end on the tiny model: every configuration starts,
answers every request, and the report has a row per configuration (no timing asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from packrat.bench.serving import run_serving_bench
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint
from packrat.runtime.cpus import allowed_cpus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.mark.skipif(len(allowed_cpus()) < 2, reason="needs a cpuset of at least 2 cpus")
def test_serving_bench_runs_all_four_configurations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    points = [
        ProfilePoint(threads=t, batch=b, latency_ms=lat)
        for (t, b), lat in {(1, 2): 1.0, (1, 4): 3.0, (2, 2): 0.9, (2, 4): 2.5}.items()
    ]
    profile = Profile(meta=ProfileMeta(model="tiny", cpus=2), points=tuple(points))
    profile.save(tmp_path / "profile.json")
    args = argparse.Namespace(
        model="tiny",
        batch="4",
        cpus=2,
        repeats=1,
        requests=8,
        profile=tmp_path / "profile.json",
        output=tmp_path / "result.json",
        workdir=tmp_path / "work",
        format="table",
    )
    assert run_serving_bench(args) == 0
    table = capsys.readouterr().out
    for config in ("packrat", "fat", "torchserve", "per_core"):
        assert f"  {config}" in table
    assert "speedup of packrat over: fat" in table
    result = json.loads((tmp_path / "result.json").read_text())
    row = result["batches"]["4"]
    assert row["plan"]["label"] == "2x1t/b2"  # 1.0 ms beats the fat 2.5 ms
    assert {c: v["errors"] for c, v in row["configs"].items()} == {
        "packrat": 0, "fat": 0, "torchserve": 0, "per_core": 0,
    }  # fmt: skip
    # 8 requests / B=4 would be 2 bursts: every run records at least 8, so medians are medians
    assert all(len(r["batch_latencies_ms"]) >= 8 for r in result["runs"])
