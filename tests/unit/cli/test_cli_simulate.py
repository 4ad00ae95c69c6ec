"""``packrat simulate`` through ``main()``: the JSON fields, a plan from ``provision``, exit
codes and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.cli import main
from packrat.plan.traces import gamma_trace, trace_to_csv

PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
FIELDS = {"p50_ms", "p99_ms", "mean_ms", "utilization", "shed_rate", "queries", "slo_miss_rate"}


def simulate_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["simulate", "--profile", str(PROFILE), "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_a_provisioned_answer_replays_to_its_planned_p99(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same trace and seed: ``simulate`` reproduces ``provision``'s P99 and utilisation;
    a fresh trace of the same process gives its own."""
    trace = tmp_path / "t.csv"
    trace.write_text(trace_to_csv(gamma_trace(60.0, cv=2.0, duration_s=30.0, seed=3)))
    assert main([
        "provision", "--profile", str(PROFILE), "--slo-p99-ms", "800", "--trace", str(trace),
        "--format", "json", "--resamples", "0",
    ]) == 0  # fmt: skip
    planned = json.loads(capsys.readouterr().out)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(planned))
    common = ["--replicas", str(planned["replicas"]), "--slo-p99-ms", "800"]
    code, doc = simulate_json([*common, "--plan", str(plan_file), "--trace", str(trace)], capsys)
    assert code == 0 and doc.keys() >= FIELDS
    assert doc["p99_ms"] == pytest.approx(planned["simulated_p99_ms"])
    assert doc["utilization"] == pytest.approx(planned["utilization"])
    assert doc["p50_ms"] <= doc["p99_ms"] and doc["shed_rate"] == 0.0
    sized = [
        "--cpus-per-replica", str(planned["cpus_per_replica"]), "--batch", str(planned["batch"]),
        "--plan-shape", planned["plan_shape"],
    ]  # fmt: skip
    code, same = simulate_json([*common, *sized, "--trace", str(trace)], capsys)
    assert same["p99_ms"] == pytest.approx(doc["p99_ms"])
    fresh = ["--rate", "60", "--cv", "2", "--seconds", "30", "--seed", "4"]
    code, other = simulate_json([*common, *sized, *fresh], capsys)
    assert other["queries"] != doc["queries"] and other["p99_ms"] is not None


def test_overload_sheds_and_exits_1_against_an_slo(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--replicas", "1", "--plan", "1x1t/b1", "--rate", "200", "--seconds", "30"]
    code, doc = simulate_json([*args, "--slo-p99-ms", "500"], capsys)
    assert code == 1 and doc["meets_slo"] is False
    assert doc["utilization"] > 1 and doc["shed_rate"] > 0 and doc["p99_ms"] is None
    code = main(["simulate", "--profile", str(PROFILE), *args])
    assert code == 0 and "shed" in capsys.readouterr().out  # no SLO: nothing to miss


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0", "--plan", "1x1t/b1", "--rate", "1"], "--replicas must be >= 1"),
        (["--replicas", "1", "--rate", "1"], "give --cpus-per-replica and --batch, or --plan"),
        (["--replicas", "1", "--plan", "2x3t/b5", "--rate", "1"], "is not in the profile"),
        (["--replicas", "1", "--plan", "1x1t/b1+x", "--rate", "1"], "is not COUNTxTHREADSt/bBATCH"),
        (["--replicas", "1", "--plan", "/nonexistent.json", "--rate", "1"], "cannot read"),
        (
            ["--replicas", "1", "--cpus-per-replica", "2", "--plan", "4x1t/b1", "--rate", "1"],
            "more than --cpus-per-replica",
        ),
        (
            ["--replicas", "1", "--cpus-per-replica", "99", "--batch", "1", "--rate", "1"],
            "exceeds the 16 cores",
        ),
        (["--replicas", "1", "--plan", "1x1t/b1", "--rate", "-3"], "--rate must be > 0"),
        (["--replicas", "1", "--plan", "1x1t/b1", "--trace", "/nonexistent"], "cannot read"),
        (
            ["--replicas", "1", "--plan", "1x1t/b1", "--rate", "1", "--slo-p99-ms", "nan"],
            "--slo-p99-ms must be > 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, refused: Callable[[list[str], str], str]
) -> None:
    refused(["simulate", "--profile", str(PROFILE), *args], message)
