"""The pod's start-up timeline: steps from several processes on one clock, against the pod's
own start, in the order they happen."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from packrat.serve.pod.timeline import STEPS, StartTimeline, process_start


def test_offsets_are_from_the_origin_in_step_order_and_skip_unmarked_steps() -> None:
    t = StartTimeline(origin=100.0)
    t.mark("ready", 102.5)
    t.mark("zygote_spawned", 100.05)
    t.mark_last("workers_warmed", [101.9, 102.4, 102.0])
    t.mark_last("workers_forked", [])  # no native workers: no step
    t.merge({"imported": 101.0, "other": 1.0}, {"imported": "torch_imported", "built": "x"})
    assert t.offsets() == {
        "zygote_spawned": 0.05,
        "torch_imported": 1.0,
        "workers_warmed": 2.4,
        "ready": 2.5,
    }
    assert list(t.offsets()) == [s for s in STEPS if s in t.offsets()]
    line = t.line()
    assert line.startswith("ready 2.50 s after the process started: zygote_spawned +0.05")
    assert line.endswith("workers_warmed +2.40, ready +2.50")


def test_a_timeline_before_ready_says_so() -> None:
    t = StartTimeline(origin=0.0)
    t.mark("dispatcher_listening", 0.5)
    assert t.line() == "start: dispatcher_listening +0.50"


def test_process_start_is_on_the_monotonic_clock_of_every_process() -> None:
    before = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        started = process_start(child.pid)
    finally:
        child.communicate(b"")
    # Clock ticks: 10 ms resolution, and the tick may round either way.
    assert before - 0.05 <= started <= time.monotonic() + 0.05
    assert process_start() <= process_start(os.getpid()) + 0.02 <= time.monotonic() + 0.02


def test_process_start_of_a_missing_process_raises() -> None:
    with pytest.raises(OSError):
        process_start(2**22 + 7)  # above the kernel's pid_max
