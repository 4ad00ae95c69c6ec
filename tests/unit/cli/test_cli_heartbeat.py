"""``packrat provision`` and ``packrat simulate`` show progress on long runs (issue 37 item 6):
a heartbeat line with the work done so far and the time elapsed, nothing for a quick run."""

from __future__ import annotations

import io
import re
import threading
import time

import pytest
from packaging_support import RESNET_PROFILE

from packrat.cli.heartbeat import Counter, heartbeat
from packrat.plan.provision import Planner, provision
from packrat.plan.traces import gamma_trace

PROFILE = RESNET_PROFILE


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
        Planner(
            table, gamma_trace(50.0, duration_s=20.0), slo_ms=50.0, max_cores=8, on_simulation=done
        )
    )
    assert done.value >= result.evaluations > 0


def test_provision_and_simulate_show_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands wire it: with the first beat due at once, both say what they do."""
    import packrat.cli.provision
    import packrat.cli.simulate
    from packrat.cli import main

    for module in (packrat.cli.provision, packrat.cli.simulate):
        monkeypatch.setattr(module, "heartbeat", lambda describe: heartbeat(describe, after_s=0))
    common = ["--profile", str(PROFILE), "--rate", "20", "--seed", "1"]
    assert main(["provision", *common, "--duration", "30", "--slo-p99-ms", "500"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"provision: \d+ simulations of \d+ arrivals, elapsed 0:\d\d", err), err
    assert main(["simulate", *common, "--seconds", "30", "--replicas", "1", "--plan",
                 "1x16t/b1"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert re.search(r"simulate: \d+ arrivals on 1 replica\(s\) of 1 instance\(s\)", err), err
