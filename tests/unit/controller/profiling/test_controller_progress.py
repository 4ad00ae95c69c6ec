"""status.profiling.progress: the profiler's progress records, read back as data."""

from __future__ import annotations

import io

import pytest

from packrat.controller.profiling.progress import parse_progress
from packrat.plan.profile import PROGRESS_PREFIX, ProgressRecord, progress_from_line
from packrat.profiler.progress import Progress


def test_reads_the_profilers_own_records() -> None:
    out = io.StringIO()
    progress = Progress(8, stream=out, label="profile tiny")
    progress.step("t=1 b=1 1.2 ms", seconds=2.0)
    progress.step("t=1 b=2 2.0 ms", seconds=4.0)
    parsed = parse_progress("loading model\n" + out.getvalue())
    assert parsed is not None
    assert parsed["done"] == 2 and parsed["total"] == 8
    assert parsed["etaSeconds"] == 18  # 3 s per point x 6 points left
    assert isinstance(parsed["elapsedSeconds"], int)
    # the human-readable bar is still there, one line per point
    assert sum("[" in line and "/8" in line for line in out.getvalue().splitlines()) == 2


def test_takes_the_last_record() -> None:
    first = ProgressRecord(done=1, total=4, elapsed_seconds=1, eta_seconds=9).to_line()
    last = ProgressRecord(done=2, total=4, elapsed_seconds=2, eta_seconds=3723).to_line()
    log = f"{first}\nprofile m [##..] 2/4 elapsed 0:02 ETA 1:02:03  b\n{last}\nother output\n"
    assert parse_progress(log) == {"done": 2, "total": 4, "etaSeconds": 3723, "elapsedSeconds": 2}


def test_unknown_eta() -> None:
    out = io.StringIO()
    Progress(4, stream=out, label="p").show("start")
    parsed = parse_progress(out.getvalue())
    assert parsed == {"done": 0, "total": 4, "etaSeconds": None, "elapsedSeconds": 0}


@pytest.mark.parametrize(
    "log",
    [
        None,
        "",
        "starting\n",
        "profile m [....] 1/4 elapsed 0:01 ETA 0:01",  # a bar is not a record
        PROGRESS_PREFIX + '{"done": 5, "total": 4}',
        PROGRESS_PREFIX + '{"done": 1, "total": 0}',
        PROGRESS_PREFIX + '{"done": true, "total": 4}',
        PROGRESS_PREFIX + '{"done": 1, "total": Infinity}',
        PROGRESS_PREFIX + '{"done": 1, "total": 1e400}',
        PROGRESS_PREFIX + '{"done": 1, "total": %s}' % ("9" * 400),
        PROGRESS_PREFIX + "[1, 4]",
        PROGRESS_PREFIX + "{",
    ],
)
def test_no_progress_from_anything_else(log: str | None) -> None:
    assert parse_progress(log) is None


def test_out_of_range_seconds_are_unknown() -> None:
    record = progress_from_line(
        PROGRESS_PREFIX + '{"done": 1, "total": 4, "etaSeconds": -5, "elapsedSeconds": "3"}'
    )
    assert record == ProgressRecord(done=1, total=4, elapsed_seconds=None, eta_seconds=None)
