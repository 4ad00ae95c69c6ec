"""``packrat provision`` and ``packrat simulate`` show progress on long runs (issue 37 item 6):
a heartbeat line with the work done so far and the time elapsed, nothing for a quick run."""

from __future__ import annotations

import io
import threading
import time

from packrat.cli.heartbeat import Counter, heartbeat
from packrat.plan.provision import provision
from packrat.plan.traces import gamma_trace


def _until(cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        threading.Event().wait(0.01)


def test_a_long_run_beats_in_a_log() -> None:
    out = io.StringIO()  # not a terminal: whole lines
    done = Counter()
    with heartbeat(lambda: f"work: {done.value} steps", stream=out, after_s=0, log_every_s=0.01):
        _until(lambda: out.getvalue().count("\n") >= 1)
        done()
        done()
        _until(lambda: "work: 2 steps" in out.getvalue())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("work: 0 steps, elapsed 0:0"), lines
    assert lines[-1].startswith("work: 2 steps, elapsed 0:0"), lines
    assert "\r" not in out.getvalue()


def test_a_quick_run_prints_nothing() -> None:
    out = io.StringIO()
    with heartbeat(lambda: "work", stream=out, after_s=60):
        pass
    assert out.getvalue() == ""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_redraws_and_is_closed() -> None:
    out = _Tty()
    with heartbeat(lambda: "work", stream=out, after_s=0, tty_every_s=0.01):
        _until(lambda: out.getvalue().count("\r") >= 2)
    text = out.getvalue()
    assert text.startswith("\r\x1b[2Kwork, elapsed ") and text.endswith("\n")


def test_provision_counts_its_simulations() -> None:
    table = {(1, 1): 5.0, (1, 2): 8.0, (2, 1): 3.0, (2, 2): 5.0}
    done = Counter()
    result = provision(
        table, gamma_trace(50.0, duration_s=20.0), slo_ms=50.0, max_cores=8, on_simulation=done
    )
    assert done.value >= result.evaluations > 0
