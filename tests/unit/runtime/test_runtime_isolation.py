"""The isolation report: cpuset size, per-core spare share, pressure files, merging."""

from __future__ import annotations

from pathlib import Path

from packrat.runtime.isolation import (
    QUIET_SHARE,
    IsolationReport,
    calibrate_core,
    merge_reports,
    read_pressure,
)


def test_read_pressure(tmp_path: Path) -> None:
    path = tmp_path / "cpu"
    path.write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert read_pressure(path) == 12.5
    assert read_pressure(tmp_path / "missing") is None


def test_quiet_exact_report() -> None:
    report = IsolationReport(requested=2, cpuset=[2, 3], share={2: 0.99, 3: 0.97}, throttled=0)
    assert report.exact and report.quiet and report.exclusive
    assert report.reasons() == []
    assert report.to_dict()["spare_share"] == {"2": 0.99, "3": 0.97}


def test_busy_and_wide_cpuset_are_reasons() -> None:
    report = IsolationReport(requested=2, cpuset=[0, 1, 2, 3], share={0: 0.5, 1: 0.99})
    assert not report.exact and not report.quiet
    assert report.busy_cores == [0]
    text = " ".join(report.reasons())
    assert "cpuset 0-3 has 4 cpu(s), 2 requested" in text
    assert "cpu 0: 0.50" in text and str(QUIET_SHARE) in text


def test_throttling_is_not_quiet() -> None:
    report = IsolationReport(requested=1, cpuset=[0], share={0: 1.0}, throttled=3)
    assert not report.quiet and "throttled 3" in report.reasons()[0]


def test_merge_keeps_the_worst() -> None:
    a = IsolationReport(requested=1, cpuset=[0], share={0: 0.95}, pressure_some_avg10=1.0)
    b = IsolationReport(requested=1, cpuset=[0], share={0: 0.4}, pressure_some_avg10=0.5)
    merged = merge_reports([a, b])
    assert merged.share == {0: 0.4} and merged.pressure_some_avg10 == 1.0
    assert merged.checks == 2 and merged.throttled is None


def test_calibration_returns_a_share_and_restores_affinity() -> None:
    import os

    before = os.sched_getaffinity(0)
    cpu = sorted(before)[0]
    share = calibrate_core(cpu, seconds=0.02)
    assert 0.0 < share <= 1.0
    assert os.sched_getaffinity(0) == before
