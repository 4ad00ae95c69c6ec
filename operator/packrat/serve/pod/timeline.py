"""A serving pod's start-up timeline: when each step of its start ended, from its process's
start to ready.

The steps run in three kinds of process (``packrat serve``, the zygote, each worker), so each
marks its steps on ``CLOCK_MONOTONIC``, which every process of a node shares
(``time.monotonic``), and the pod collects them: the zygote's from the file it writes before
it listens (:data:`packrat.serve.zygote.zygote.TIMELINE_FILE`), a native worker's from its
hello. The origin is the pod process's own start, read from ``/proc`` (the interpreter's start
and the imports before :func:`main` count too). Pure but for :func:`process_start`; what the
pod logs and exports: :meth:`StartTimeline.line` and :meth:`StartTimeline.offsets`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["STEPS", "StartTimeline", "process_start"]

# The steps in the order they happen (a step no process marked is left out).
STEPS = (
    "zygote_spawned",  # the pod started its zygote (first thing ``packrat serve`` does)
    "dispatcher_listening",  # /ping answers (not ready yet)
    "torch_imported",  # the zygote imported torch and what the workers run
    "model_built",  # the zygote built (or mapped) the model
    "zygote_listening",  # it forks workers from here on
    "workers_forked",  # the last instance's worker began (native)
    "workers_loaded",  # ... pinned and holding the model (native)
    "workers_warmed",  # ... answered its warm-up batch
    "ready",  # every instance up: /ping answers 200
)


def process_start(pid: int | str = "self") -> float:
    """When process ``pid`` started, on ``time.monotonic``'s clock (10 ms resolution: the
    kernel counts clock ticks since boot, on ``CLOCK_BOOTTIME``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age


@dataclass
class StartTimeline:
    """Step -> when it ended (monotonic seconds), against ``origin``, the pod's start."""

    origin: float
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str, at: float | None = None) -> None:
        self.marks[step] = time.monotonic() if at is None else at

    def mark_last(self, step: str, times: Iterable[float]) -> None:
        """``step`` ends when the last of ``times`` does (the instances' workers)."""
        latest = max(times, default=None)
        if latest is not None:
            self.mark(step, latest)

    def merge(self, marks: Mapping[str, float], steps: Mapping[str, str]) -> None:
        """Take ``marks`` (another process's) for the steps ``steps`` maps them to."""
        for theirs, ours in steps.items():
            if theirs in marks:
                self.mark(ours, marks[theirs])

    def offsets(self) -> dict[str, float]:
        """Seconds from the pod's start to each step's end, in :data:`STEPS` order."""
        return {
            step: round(self.marks[step] - self.origin, 3) for step in STEPS if step in self.marks
        }

    def line(self) -> str:
        """One log line: the total, then each step's end after the pod's start."""
        offsets = self.offsets()
        steps = ", ".join(f"{step} +{at:.2f}" for step, at in offsets.items())
        total = offsets.get("ready")
        head = f"ready {total:.2f} s after the process started" if total is not None else "start"
        return f"{head}: {steps}"
