"""status.profiling.progress: parsed from what the profiler really prints."""

from __future__ import annotations

import io

import pytest

from packrat.controller.profiling.progress import parse_duration, parse_progress
from packrat.profiler.progress import Progress


def test_parses_the_profilers_own_lines() -> None:
    out = io.StringIO()
    progress = Progress(8, stream=out, label="profile tiny")
    progress.step("t=1 b=1 1.2 ms", seconds=2.0)
    progress.step("t=1 b=2 2.0 ms", seconds=4.0)
    parsed = parse_progress("loading model\n" + out.getvalue())
    assert parsed is not None
    assert parsed["done"] == 2 and parsed["total"] == 8
    assert parsed["etaSeconds"] == 18  # 3 s per point x 6 points left
    assert isinstance(parsed["elapsedSeconds"], int)


def test_takes_the_last_line_and_tolerates_terminal_redraws() -> None:
    log = (
        "profile m [#...] 1/4 elapsed 0:01 ETA 0:09  a\r"
        "profile m [##..] 2/4 elapsed 0:02 ETA 1:02:03  b\n"
        "some other output\n"
    )
    assert parse_progress(log) == {
        "done": 2,
        "total": 4,
        "etaSeconds": 3723,
        "elapsedSeconds": 2,
    }


@pytest.mark.parametrize(
    "log",
    [None, "", "starting\n", "profile m [....] 5/4 elapsed 0:01 ETA 0:01", "x [..] 1/0 elapsed"],
)
def test_no_progress_yet(log: str | None) -> None:
    assert parse_progress(log) is None


def test_unknown_eta() -> None:
    parsed = parse_progress("profile m [....] 0/4 elapsed 0:00 ETA ?  start")
    assert parsed is not None and parsed["etaSeconds"] is None and parsed["done"] == 0


@pytest.mark.parametrize(
    ("text", "seconds"), [("0:05", 5), ("12:00", 720), ("1:00:01", 3601), ("?", None), ("5", None)]
)
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds
