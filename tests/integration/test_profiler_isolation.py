"""Verified isolation with real processes: a busy loop pinned to the profiled core is found by
the spare-CPU calibration, and the contaminated profile is refused (or kept, flagged, when
allowed). A pinned spinner takes about half of its core whatever else the machine does, so
the check's verdict is a behaviour, not a timing race."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from packrat.plan.profile import load_profile
from packrat.profiler.profiler import ProfilerError, ProfileSettings, run_profile
from packrat.runtime.cpus import allowed_cpus
from packrat.runtime.isolation import QUIET_SHARE, check_isolation

pytestmark = pytest.mark.integration

CPU = allowed_cpus()[-1]
FAST = ProfileSettings(
    precision=0.3, point_budget_s=0.3, warmup=1, min_samples=3, allow_contended=False
)
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@pytest.fixture
def spinner() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", SPIN, str(CPU)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # running, pinned
            if os.sched_getaffinity(proc.pid) == {CPU}:
                break
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_calibration_finds_the_busy_core(spinner: int) -> None:
    report = check_isolation(1, cpus=[CPU])
    assert report.exact
    assert report.share[CPU] < QUIET_SHARE and report.busy_cores == [CPU]
    assert not report.quiet and "busy core" in report.reasons()[0]


def test_a_contaminated_profile_is_refused_and_set_aside(spinner: int, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    with pytest.raises(ProfilerError, match="refusing to store a contaminated profile"):
        run_profile(spec="tiny", cpus=1, max_batch=2, output=out, settings=FAST, allowed=[CPU])
    assert not out.exists()  # a rerun must not resume from it
    kept = json.loads((tmp_path / "tiny.json.contaminated").read_text())
    isolation = kept["meta"]["extra"]["isolation"]
    assert isolation["contaminated"] and isolation["busy_cores"] == [CPU]


def test_allowed_contention_is_stored_and_flagged(spinner: int, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    run = run_profile(
        spec="tiny",
        cpus=1,
        max_batch=2,
        output=out,
        settings=replace(FAST, allow_contended=True),
        allowed=[CPU],
    )
    isolation = load_profile(out).meta.extra["isolation"]
    assert run.isolation == isolation
    assert isolation["contaminated"] and isolation["allow_contended"]
    assert isolation["checks"] >= 2  # before and after the grid


def test_cli_refusal_is_one_line_and_exit_2(spinner: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PACKRAT_ALLOW_CONTENDED"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "packrat",
            "profile",
            "--model",
            "tiny",
            "--cpus",
            "1",
            "--max-batch",
            "1",
            "--point-budget",
            "0.3",
            "-o",
            str(tmp_path / "p.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, {CPU}),
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("packrat profile: error: refusing to store a contaminated profile")
