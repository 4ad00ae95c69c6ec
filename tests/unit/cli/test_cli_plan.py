"""``packrat plan`` end to end through ``main()``: JSON shape, table, plot and clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.cli import main

PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"


@pytest.fixture
def profile_csv(tmp_path: Path) -> Path:
    path = tmp_path / "toy.csv"
    rows = ["threads,batch,latency_ms"]
    for t in (1, 2):
        for b in (1, 2, 4, 8):
            rows.append(f"{t},{b},{2.0 + b * (0.2 + 0.8 / t) * (1 + 0.3 * t):.4f}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_json_for_one_batch_is_an_object(
    profile_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "plan",
                "--profile",
                str(profile_csv),
                "--cpus",
                "2",
                "--batch",
                "8",
                "--format",
                "json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["cpus"] == 2 and data["batch"] == 8
    assert {"threads", "batch", "count"} <= set(data["instances"][0])
    assert sum(g["batch"] * g["count"] for g in data["instances"]) == 8
    assert data["fat_latency_ms"] is not None
    assert data["expected_speedup"] == pytest.approx(
        data["fat_latency_ms"] / data["expected_latency_ms"]
    )


def test_json_for_several_batches_is_an_array(
    profile_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["plan", "--profile", str(profile_csv), "--batch", "2,3,8", "--format", "json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [d["batch"] for d in data] == [2, 3, 8]
    assert data[1]["fat_latency_ms"] is None and data[1]["expected_speedup"] is None


def test_table_and_plot(
    profile_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plot.png"
    args = ["plan", "--profile", str(profile_csv), "--batch", "1-6,8", "--plot", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "speedup" in text.splitlines()[0]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpus", "4", "--batch", "8"], "exceeds the 2 cores the profile was measured on"),
        (["--batch", "0"], "--batch must be positive"),
        (["--batch", "x"], "--batch must be comma-separated integers"),
        (["--batch", "1024"], "no combination"),
    ],
)
def test_errors_are_clean(
    profile_csv: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["plan", "--profile", str(profile_csv), *args]) == 2
    assert message in capsys.readouterr().err


def test_corrupt_profile_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("threads,batch,latency_ms\n1,1,-1\n")
    assert main(["plan", "--profile", str(bad), "--batch", "1"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 2" in err
