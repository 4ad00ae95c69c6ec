"""Arrival traces: gamma generation statistics and the CSV reader's errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.traces import (
    TraceError,
    gamma_trace,
    load_trace,
    mean_rate,
    parse_trace,
    peak_rate,
    step_trace,
    trace_to_csv,
)


@pytest.mark.parametrize("cv", [0.5, 1.0, 4.0])
def test_gamma_trace_has_the_asked_rate_and_cv(cv: float) -> None:
    times = gamma_trace(200.0, cv=cv, duration_s=500.0, seed=3)
    gaps = np.diff(times)
    assert times[0] >= 0 and times[-1] < 500.0
    assert np.all(gaps >= 0)
    assert mean_rate(times) == pytest.approx(200.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_gamma_trace_is_seeded() -> None:
    a = gamma_trace(50.0, cv=2.0, duration_s=10.0, seed=7)
    b = gamma_trace(50.0, cv=2.0, duration_s=10.0, seed=7)
    c = gamma_trace(50.0, cv=2.0, duration_s=10.0, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0.0}, "rate must be"),
        ({"rate": 1.0, "cv": -1.0}, "cv must be"),
        ({"rate": 1.0, "duration_s": float("nan")}, "duration must be"),
    ],
)
def test_gamma_trace_rejects_bad_parameters(kwargs: dict[str, float], message: str) -> None:
    rate = kwargs.pop("rate")
    with pytest.raises(TraceError, match=message):
        gamma_trace(rate, **kwargs)


def test_step_trace_changes_rate_between_phases() -> None:
    times = step_trace([50.0, 200.0], phase_s=50.0, seed=1)
    first = times[times < 50.0]
    second = times[times >= 50.0]
    assert mean_rate(first) == pytest.approx(50.0, rel=0.1)
    assert mean_rate(second) == pytest.approx(200.0, rel=0.1)
    assert np.all(np.diff(times) >= 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_csv_round_trip(values: list[float]) -> None:
    times = np.sort(np.array(values))
    back = parse_trace(trace_to_csv(times))
    assert np.allclose(back, np.round(times, 6) - np.round(times, 6)[0], atol=1e-5)


def test_plain_lines_and_comments_shift_to_zero() -> None:
    text = "# recorded\n10.5\n\n10.75\n12\n"
    assert parse_trace(text).tolist() == [0.0, 0.25, 1.5]


def test_timestamp_column_among_others() -> None:
    text = "id,timestamp,path\n1,3.0,/a\n2,3.5,/b\n"
    assert parse_trace(text).tolist() == [0.0, 0.5]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no timestamps"),
        ("# only a comment\n", "no timestamps"),
        ("time,path\n1,/a\n", "line 1: no 'timestamp' column"),
        ("1.0,2.0\n", "line 1: several numbers but no header"),
        ("1.0\nabc\n", "line 2: not a number: 'abc'"),
        ("1.0\n0.5\n", "line 2: timestamp 0.5 is before the previous one"),
        ("1.0\ninf\n", "line 2: timestamp must be finite"),
        ("timestamp,x\n1.0,2\n3\n", None),
        ("x,timestamp\n1.0,2\n3\n", "line 3: expected a value in column 2"),
    ],
)
def test_parse_errors_name_the_line(text: str, message: str | None) -> None:
    if message is None:
        assert parse_trace(text).tolist() == [0.0, 2.0]
        return
    with pytest.raises(TraceError, match=message):
        parse_trace(text, origin="t.csv")


def test_load_trace_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="missing.csv: cannot read"):
        load_trace(tmp_path / "missing.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not a text file"):
        load_trace(binary)
    good = tmp_path / "good.csv"
    good.write_text("timestamp\n0\n1\n")
    assert load_trace(good).tolist() == [0.0, 1.0]


def test_peak_rate_counts_the_densest_window() -> None:
    times = np.array([0.0, 0.1, 0.2, 0.3, 5.0])
    assert peak_rate(times, window_s=1.0) == 4.0
    assert peak_rate(np.array([]), window_s=1.0) == 0.0
