"""The profiler's progress records (``packrat-progress {...}``) go to logs, not to a person
(issue 37 item 6): on by default only off a terminal, forced on for the operator's Job, off
for ``packrat demo``."""

from __future__ import annotations

import io

from packrat.controller.core.model import parse
from packrat.controller.profiling.manifests import profile_command
from packrat.plan.profile import PROGRESS_PREFIX
from packrat.profiler.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _show(stream: io.StringIO, records: bool | None) -> str:
    progress = Progress(2, stream=stream, records=records)
    progress.step("one", seconds=1.0)
    return stream.getvalue()


def test_records_follow_the_stream_by_default() -> None:
    assert PROGRESS_PREFIX in _show(io.StringIO(), None)  # a log
    assert PROGRESS_PREFIX not in _show(_Tty(), None)  # a terminal


def test_records_on_or_off_when_asked() -> None:
    assert PROGRESS_PREFIX not in _show(io.StringIO(), False)  # the demo, piped or not
    shown = _show(_Tty(), True)
    assert PROGRESS_PREFIX in shown and "\n" + PROGRESS_PREFIX in shown  # on its own line


def test_the_operators_job_asks_for_them() -> None:
    body = {
        "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
        "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2},
    }
    cmd = profile_command(parse(body), output="/out/profile.json")
    i = cmd.index("--progress-records")
    assert cmd[i + 1] == "on" and cmd[-2:] == ["-o", "/out/profile.json"]
    # and it still refuses a contended profile (a dedicated node's busy cores are a fault)
    assert "--allow-contended" not in cmd
