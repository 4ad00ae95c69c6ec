"""How a point's instances are driven (packrat.profiler.measure), with scripted workers:
lockstep rounds over the timed instances, the filler kept busy but never waited for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from packrat.profiler.errors import ProfilerError
from packrat.profiler.layout import PointLayout
from packrat.profiler.measure import Lockstep, check_pinning, measure_layout
from packrat.profiler.profiler import ProfileSettings


class ScriptedWorker:
    """Answers ``run`` with a batch of ``ms`` milliseconds; the filler's answers arrive only
    when the test says so (``finish``)."""

    def __init__(self, cpus: Sequence[int], threads: int, ms: float, *, held: bool) -> None:
        self.cpus, self.threads, self.ms, self.held = list(cpus), threads, ms, held
        self.sent: list[dict[str, Any]] = []
        self.pending = 0
        self.finished = 0
        self.closed = self.killed = False
        self.ready: dict[str, Any] = {}
        self.clock = 0.0

    def wait_ready(self, *, timeout: float) -> dict[str, Any]:
        self.ready = {"affinity": self.cpus, "thread_affinity": self.cpus,
                      "threads": self.threads, "interop_threads": 1, "forked": True}  # fmt: skip
        return self.ready

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)
        self.pending += 1

    def _reply(self) -> dict[str, Any]:
        self.pending -= 1
        self.clock += 1.0
        return {"start": self.clock, "end": self.clock + self.ms / 1000, "cpu_s": self.ms / 1000}

    def recv(self, *, timeout: float) -> dict[str, Any]:
        assert not self.held, "the filler must never be waited for"
        return self._reply()

    def poll(self) -> dict[str, Any] | None:
        if self.finished and self.pending:
            self.finished -= 1
            return self._reply()
        return None

    def close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.killed = True


class ScriptedSource:
    kind = "forked"
    startup_s = 0.0

    def __init__(self, ms: dict[int, float]) -> None:
        self.ms = ms
        self.workers: list[ScriptedWorker] = []

    def start(self) -> None: ...

    def close(self) -> None: ...

    def spawn(self, *, cpus: Sequence[int], threads: int) -> ScriptedWorker:
        held = len(self.workers) >= self.ms.get(-1, 99)  # workers past the timed ones
        worker = ScriptedWorker(cpus, threads, self.ms[threads], held=held)
        self.workers.append(worker)
        return worker


def test_the_filler_is_kept_busy_and_never_waited_for() -> None:
    timed = [ScriptedWorker([0], 1, 2.0, held=False), ScriptedWorker([1], 1, 4.0, held=False)]
    filler = ScriptedWorker([2], 1, 50.0, held=True)
    steps = Lockstep(timed, batch=4, filler=filler, timeout=10)  # type: ignore[arg-type]
    assert steps.round() == pytest.approx([2.0, 4.0])
    assert steps.round() == pytest.approx([2.0, 4.0])
    assert len(filler.sent) == 1  # still busy with its first batch: not sent another
    filler.finished = 1
    steps.round()
    assert len(filler.sent) == 2 and filler.sent[-1] == {"cmd": "run", "batch": 4}
    assert [len(w.sent) for w in timed] == [3, 3]


def test_measure_layout_times_every_instance_and_reports_the_slowest() -> None:
    """Two timed 2-thread instances and a 1-thread filler on 5 cores; each round gives two
    samples; the filler is killed, the timed instances closed."""
    source = ScriptedSource({2: 3.0, 1: 50.0, -1: 2})
    layout = PointLayout(2, ((0, 1), (2, 3)), (4,))
    settings = ProfileSettings(precision=0.5, warmup=1, min_samples=3, point_budget_s=60)
    point, report = measure_layout(source, layout, batch=8, settings=settings, budget_s=60)  # type: ignore[arg-type]
    assert (point.threads, point.batch) == (2, 8)
    assert point.latency_ms == pytest.approx(3.0)
    assert report["instances"] == 2 and report["filler"] == 1
    assert report["rounds"] >= 3 and point.samples == 2 * report["rounds"]
    assert report["slowest_ms"] == pytest.approx(3.0)
    assert report["cpu_share"] == pytest.approx(0.5)  # 3 ms of CPU per 3 ms batch on 2 threads
    timed, filler = source.workers[:2], source.workers[2]
    assert all(w.closed for w in timed) and filler.killed
    assert [w.cpus for w in source.workers] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("ready", "message"),
    [
        ({"affinity": [0, 1], "threads": 2, "interop_threads": 1}, "pinned to"),
        ({"affinity": [0], "threads": 1, "thread_affinity": [0, 1]}, "outside its cores"),
        ({"affinity": [0], "threads": 1, "interop_threads": 4}, "inter-op"),
    ],
)
def test_a_worker_pinned_wrong_is_refused(ready: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfilerError, match=message):
        check_pinning(ready, cores=[0], threads=1)
