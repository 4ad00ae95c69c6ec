"""``packrat provision --pipeline`` through ``main()``: per-stage JSON, the table, exit codes
and one-line errors for bad pipeline files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.cli import main

EXAMPLE = ROOT / "benchmarks" / "pipelines" / "three-stage.yaml"
PROFILES = ROOT / "benchmarks" / "profiles"


TWO_STAGE = """
stages:
  - {name: small, profile: resnet-pytorch.csv, maxCpus: 4}
  - {name: big, profile: resnet-torchserve.csv, maxCpus: 4}
edges:
  - {from: small, to: big, fraction: 0.5}
slo: {latencyP99Ms: 900}
"""


def _provision_two_stage(pipeline_file: Callable[[str], Path], *flags: str) -> int:
    """``packrat provision --pipeline`` of ``TWO_STAGE`` with ``flags``: the exit code."""
    return main(["provision", "--pipeline", str(pipeline_file(TWO_STAGE)), *flags])


def test_json_has_every_stage_and_both_baselines(
    capsys: pytest.CaptureFixture[str], pipeline_file: Callable[[str], Path]
) -> None:
    code = _provision_two_stage(pipeline_file, "--rate", "20", "--duration", "10", "--format=json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["feasible"] and doc["simulated_p99_ms"] <= doc["slo_p99_ms"] == 900
    assert [s["name"] for s in doc["stages"]] == ["small", "big"]
    for s in doc["stages"]:
        assert 1 <= s["cpus_per_replica"] <= 4
        assert s["cores"] == s["replicas"] * s["cpus_per_replica"]
        assert sum(g["batch"] * g["count"] for g in s["plan"]["instances"]) == s["batch"]
    assert doc["cores"] == sum(s["cores"] for s in doc["stages"])
    assert set(doc["baselines"]) == {"mean", "peak"}
    for base in doc["baselines"].values():
        assert base["cores"] == base["units"] * 8
        assert {s["name"] for s in base["stages"]} == {"small", "big"}


def test_the_example_as_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["provision", "--pipeline", str(EXAMPLE), "--rate", "40", "--duration", "8"])
    out = capsys.readouterr().out
    assert code == 0
    for word in ("detect", "classify", "refine", "planned", "CG-mean", "CG-peak"):
        assert word in out


def test_an_impossible_slo_exits_1(
    capsys: pytest.CaptureFixture[str], pipeline_file: Callable[[str], Path]
) -> None:
    code = _provision_two_stage(pipeline_file, "--slo-p99-ms", "50", "--rate", "5", "--duration=5")
    out = capsys.readouterr().out
    assert code == 1 and "infeasible" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages: []\n", "stages: expected a non-empty list"),
        ("stages:\n  - {name: a}\n", "stages[0].profile: expected a path"),
        ("stages:\n  - {name: a, profile: nope.csv}\n", "stages[0].profile:"),
        (
            "stages:\n  - {name: a, profile: resnet-pytorch.csv}\nedges:\n  - {from: a, to: b}\n",
            "unknown stage 'b'",
        ),
        (
            "stages:\n  - {name: a, profile: resnet-pytorch.csv}\n"
            "  - {name: b, profile: resnet-pytorch.csv}\n"
            "edges:\n  - {from: a, to: b, fraction: 2}\n",
            "fraction must be in [0, 1]",
        ),
        (
            "stages:\n  - {name: a, profile: resnet-pytorch.csv, maxCpus: 99}\n",
            "exceeds the 16 cores",
        ),
        ("stages:\n  - {name: a, profile: resnet-pytorch.csv, replicas: 3}\n", "unknown field"),
        ("stages:\n  - {name: a, profile: resnet-pytorch.csv}\n", "no slo.latencyP99Ms"),
        ("stages: [\n", "not valid YAML"),
    ],
)
def test_bad_pipeline_files_fail_with_one_line(
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
    pipeline_file: Callable[[str], Path],
) -> None:
    path = pipeline_file(text)
    code = main(["provision", "--pipeline", str(path), "--rate", "5", "--duration", "5"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "\n" not in err, err


def test_profile_mode_still_needs_an_slo(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["provision", "--profile", str(PROFILES / "resnet-pytorch.csv"), "--rate", "5"])
    assert code == 2 and "--slo-p99-ms is required" in capsys.readouterr().err
