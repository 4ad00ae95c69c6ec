"""Issue 38: ``packrat provision --trace`` with a 1e308 timestamp was a traceback (the
simulators work in milliseconds and overflowed). Its siblings, the other numbers of traces and
of the planners' flags (inf, nan, huge, negative), are each one clear line and exit 2, never a
traceback or minutes of simulation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from packaging_support import RESNET_PROFILE

from packrat.cli import main
from packrat.plan.traces import MAX_TRACE_SPAN_S, TraceError, gamma_trace, parse_trace

PROFILE = RESNET_PROFILE
PROVISION = ["provision", "--profile", str(PROFILE), "--slo-p99-ms", "500"]
SIMULATE = ["simulate", "--profile", str(PROFILE), "--replicas", "1", "--plan", "1x16t/b1"]
SYNTHETIC = ["--rate", "2", "--duration", "5"]


def _one_line(capsys: pytest.CaptureFixture[str], code: int, needle: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize(
    "lines",
    [
        "0\n1e308\n",  # the trace
        "0\n0.001\n0.002\n1e308\n",
        "-1e308\n1e308\n",  # a span that is not even finite
        f"0\n{MAX_TRACE_SPAN_S + 1}\n",
    ],
)
@pytest.mark.parametrize("command", ["provision", "simulate"])
def test_a_trace_spanning_too_long_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, command: str
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(lines)
    args = PROVISION if command == "provision" else SIMULATE
    _one_line(capsys, main([*args, "--trace", str(trace)]), "at most 31536000 s")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--max-batch-delay-ms", "nan"], "--max-batch-delay-ms must be >= 0, got nan"),
        (["--max-batch-delay-ms", "inf"], "--max-batch-delay-ms must be >= 0, got inf"),
        (["--max-batch-delay-ms", "1e308"], "--max-batch-delay-ms must be <= 10000"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--seed", str(2**64)], "--seed must be <= "),
        (["--rate", "1e-300", "--duration", "1e308"], "at most"),
        (["--rate", "1e-3", "--duration", "1e9"], "--duration must be at most 31536000 s"),
        (["--rate", "inf"], "--rate must be > 0, got inf"),
        (["--cv", "nan"], "--cv must be > 0, got nan"),
    ],
)
def test_provision_numbers_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    _one_line(capsys, main([*PROVISION, *SYNTHETIC, *flags]), needle)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--replicas", "1000000000"], "--replicas must be <= 10000, got 1000000000"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--max-batch-delay-ms", "1e308"], "--max-batch-delay-ms must be <= 10000"),
        (["--seconds", "1e308", "--rate", "1e-300"], "duration must be at most 31536000 s"),
        (["--seconds", "1e5", "--rate", "1e3"], "at most 1000000"),
        (["--service-cv", "inf"], "--service-cv must be >= 0, got inf"),
        (["--batch", "1000000000"], "--batch must be <= 1024, got 1000000000"),
    ],
)
def test_simulate_numbers_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    base = [*SIMULATE, "--rate", "2", "--seconds", "5"]
    _one_line(capsys, main([*base, *flags]), needle)


def test_trace_functions_refuse_what_the_simulators_cannot_hold() -> None:
    with pytest.raises(TraceError, match="span"):
        parse_trace("0\n1e308\n")
    with pytest.raises(TraceError, match="seed"):
        gamma_trace(1.0, duration_s=1.0, seed=-1)
    with pytest.raises(TraceError, match="arrivals"):
        gamma_trace(1e300, duration_s=1.0)
    assert parse_trace(f"0\n{MAX_TRACE_SPAN_S}\n")[-1] == MAX_TRACE_SPAN_S  # the edge holds


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--rate", "nan"], "--rate must be > 0, got nan"),
        (["--rate", "1", "--duration", "inf"], "--duration must be > 0, got inf"),
        (["--rate", "1", "--duration", "1e308"], "--duration must be <= 31536000"),
        (["--rate", "1e308"], "requests; at most 1000000"),
        (["--rate", "1", "--timeout", "nan"], "--timeout must be > 0, got nan"),
        (["--rate", "1", "--timeout", "1e308"], "--timeout must be <= 3600"),
        (["--rate", "1", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--burst", "1000000000"], "--burst must be <= 100000"),
        (["--burst", "1", "--bursts", "0"], "--bursts must be >= 1, got 0"),
    ],
)
def test_loadgen_numbers_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    args = ["loadgen", "--url", "http://127.0.0.1:9", "--model", "tiny", *flags]
    _one_line(capsys, main(args), needle)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--drain-seconds", "nan"], "--drain-seconds must be >= 0, got nan"),
        (["--drain-grace-seconds", "1e308"], "--drain-grace-seconds must be <= 3600"),
        (["--body-timeout", "nan"], "--body-timeout must be > 0, got nan"),
        (["--header-timeout", "inf"], "--header-timeout must be > 0, got inf"),
        (["--max-batch-delay-ms", str(10**30)], "--max-batch-delay-ms must be <= 10000"),
    ],
)
def test_serve_numbers_are_one_line_before_anything_starts(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    # a plan file that does not exist: the numbers are checked before it is read
    args = ["serve", "--model", "tiny", "--plan", "/nonexistent/plan.json", *flags]
    _one_line(capsys, main(args), needle)


@pytest.mark.parametrize(
    ("field", "value"),
    [("point_budget_s", math.nan), ("point_budget_s", math.inf), ("time_budget_s", math.nan),
     ("time_budget_s", 1e308), ("point_budget_s", -1.0)],
)  # fmt: skip
def test_profile_budgets_are_finite(field: str, value: float) -> None:
    from packrat.profiler.errors import ProfilerError
    from packrat.profiler.profiler import ProfileSettings

    with pytest.raises(ProfilerError, match="budget must be in"):
        ProfileSettings(**{field: value}).check()


@pytest.mark.parametrize("batch", ["1-1000000000", ",".join(["1"] * 70_000)])
def test_a_huge_batch_list_is_one_line(capsys: pytest.CaptureFixture[str], batch: str) -> None:
    """``packrat plan --batch 1-1000000000`` built a billion integers before any check."""
    args = ["plan", "--profile", str(PROFILE), "--cpus", "16", "--batch", batch]
    _one_line(capsys, main(args), "more than 65536 values")
