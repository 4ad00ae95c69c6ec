"""``packrat provision`` through ``main()``: the JSON fields, exit codes and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.cli import main
from packrat.plan.traces import gamma_trace, trace_to_csv

PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
FIELDS = {
    "replicas",
    "cpus_per_replica",
    "batch",
    "plan",
    "cores",
    "simulated_p99_ms",
    "slo_p99_ms",
    "feasible",
    "baselines",
}


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["provision", "--profile", str(PROFILE), "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_json_fields_from_a_synthetic_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(["--slo-p99-ms", "400", "--rate", "80", "--duration", "20"], capsys)
    assert code == 0
    assert doc.keys() >= FIELDS
    assert doc["feasible"] and doc["simulated_p99_ms"] <= 400
    assert doc["cores"] == doc["replicas"] * doc["cpus_per_replica"]
    plan = doc["plan"]
    assert plan["cpus"] == doc["cpus_per_replica"] and plan["batch"] == doc["batch"]
    assert sum(g["batch"] * g["count"] for g in plan["instances"]) == doc["batch"]
    assert set(doc["baselines"]) == {"mean", "peak"}
    for base in doc["baselines"].values():
        assert {"replicas", "cores", "simulated_p99_ms", "feasible"} <= set(base)


def test_trace_file_and_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "arrivals.csv"
    trace.write_text(trace_to_csv(gamma_trace(50.0, cv=2.0, duration_s=20.0, seed=3)))
    code = main(
        ["provision", "--profile", str(PROFILE), "--slo-p99-ms", "600", "--trace", str(trace)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "planned" in out and "mean" in out and "peak" in out and "plan per replica" in out


def test_infeasible_exits_1_with_the_best_p99(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(["--slo-p99-ms", "5", "--rate", "10", "--duration", "10"], capsys)
    assert code == 1
    assert doc["feasible"] is False
    assert doc["simulated_p99_ms"] > 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo-p99-ms", "0", "--rate", "1"], "--slo-p99-ms must be > 0"),
        (["--slo-p99-ms", "100", "--rate", "-1"], "--rate must be > 0"),
        (["--slo-p99-ms", "100", "--rate", "1", "--cv", "0"], "--cv must be > 0"),
        (["--slo-p99-ms", "100", "--rate", "1", "--max-cores", "0"], "--max-cores must be"),
        (["--slo-p99-ms", "100", "--rate", "1", "--max-cpus", "99"], "exceeds the 16 cores"),
        (["--slo-p99-ms", "100", "--trace", "/nonexistent/t.csv"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, refused: Callable[[list[str], str], str]
) -> None:
    refused(["provision", "--profile", str(PROFILE), *args], message)


def test_malformed_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("1.0\n2.0\nlater\n")
    code = main(
        ["provision", "--profile", str(PROFILE), "--slo-p99-ms", "100", "--trace", str(trace)]
    )
    assert code == 2
    assert "bad.csv: line 3: not a number" in capsys.readouterr().err


def test_loadgen_trace_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("timestamp\n2\n1\n")
    body = tmp_path / "body.json"
    body.write_text("{}")
    args = ["loadgen", "--url", "http://127.0.0.1:9", "--model", "m", "--input", str(body)]
    assert main([*args, "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "t.csv: line 3: timestamp 1.0 is before the previous one" in err
    assert err.count("\n") == 1
