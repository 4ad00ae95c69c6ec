"""``packrat serve`` and ``packrat loadgen`` arguments: clear errors before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat.cli import build_parser, main


def test_serve_parses_the_pod_command(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "resnet50",
            "--plan-env",
            "PACKRAT_PLAN",
            "--port",
            "8080",
            "--host",
            "0.0.0.0",
            "--max-batch-delay-ms",
            "5",
        ]
    )
    assert args.plan_env == "PACKRAT_PLAN" and args.port == 8080 and args.max_batch_delay_ms == 5
    assert args.queue_limit == 1024 and args.drain_seconds == 30.0
    assert args.runtime == "native"


def test_the_clis_runtimes_are_the_servers() -> None:
    """The CLI names them without importing the serving stack (a fast start); they agree."""
    from packrat.cli import serve as cli_serve
    from packrat.controller.api.schema import MODEL_CRD, crd_schema
    from packrat.serve import config

    crd = crd_schema(MODEL_CRD)["properties"]["spec"]["properties"]["runtime"]["enum"]
    assert cli_serve.RUNTIMES == config.RUNTIMES == tuple(crd)  # spec.runtime: the CRD's enum
    assert cli_serve.DEFAULT_RUNTIME == config.DEFAULT_RUNTIME
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["serve", "--model", "tiny", "--plan-env", "P", "--runtime", "jvm"]
        )


def test_serve_needs_exactly_one_plan_source() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "tiny"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "tiny", "--plan", "p", "--plan-env", "V"])


def test_missing_plan_env_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PACKRAT_PLAN_X", raising=False)
    assert main(["serve", "--model", "tiny", "--plan-env", "PACKRAT_PLAN_X"]) == 2
    assert "PACKRAT_PLAN_X is not set" in capsys.readouterr().err


def test_invalid_plan_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"cpus": 2, "batch": 4, "instances": []}))
    assert main(["serve", "--model", "tiny", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert str(plan) in err


def test_a_plan_larger_than_the_cpuset_fails_at_startup(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = {
        "cpus": 4096,
        "batch": 8,
        "instances": [{"threads": 4096, "batch": 8, "count": 1}],
        "expected_latency_ms": 1.0,
    }
    monkeypatch.setenv("PACKRAT_PLAN_BIG", json.dumps(plan))
    assert main(["serve", "--model", "tiny", "--plan-env", "PACKRAT_PLAN_BIG"]) == 2
    assert "needs 4096 cpus but this process may use" in capsys.readouterr().err


def test_cpus_outside_the_cpuset_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "PACKRAT_PLAN_ONE",
        json.dumps(
            {
                "cpus": 1,
                "batch": 1,
                "instances": [{"threads": 1, "batch": 1, "count": 1}],
                "expected_latency_ms": 1.0,
            }
        ),
    )
    assert (
        main(["serve", "--model", "tiny", "--plan-env", "PACKRAT_PLAN_ONE", "--cpus", "100000"])
        == 2
    )
    assert "outside this process's cpuset" in capsys.readouterr().err


def test_loadgen_modes_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["loadgen", "--url", "u", "--model", "m"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["loadgen", "--url", "u", "--model", "m", "--burst", "4", "--rate", "3"]
        )
    args = build_parser().parse_args(["loadgen", "--url", "u", "--model", "m", "--rate", "3"])
    assert args.duration == 10.0 and args.format == "table"


def test_loadgen_needs_an_input_for_a_non_zoo_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadgen", "--url", "http://127.0.0.1:9", "--model", "mine", "--burst", "1"]) == 2
    assert "--input FILE" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["nosuch-model", "/nonexistent/model.pt", "/tmp"])
def test_an_unknown_model_is_one_clear_line_before_anything_starts(
    model: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PACKRAT_PLAN_X", "{}")
    assert main(["serve", "--model", model, "--plan-env", "PACKRAT_PLAN_X"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown model" in err and model in err
