"""InPodSwitch's decisions without a runtime: a failed start keeps the old plan, and one
switch at a time. The pod and its runtime backend are small in-memory stand-ins that record
what the switch asked of them (the backend contract, packrat.serve.pod.runtime); the
dispatcher is the real one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from packrat.plan.optimizer import Plan
from packrat.serve.config import InstanceSpec, WorkerState, plan_instances
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.native.runtime import NativeStartError
from packrat.serve.pod.inpod import InPodSwitch, SwitchError
from packrat.serve.pod.server import ServeOptions


def _plan(count: int, threads: int, batch: int) -> Plan:
    return Plan.from_dict(
        {
            "cpus": 2,
            "batch": count * batch,
            "instances": [{"threads": threads, "batch": batch, "count": count}],
            "expected_latency_ms": 1.0,
            "fat_latency_ms": 1.0,
        }
    )


THIN, FAT = _plan(2, 1, 2), _plan(1, 2, 4)


@dataclass
class _Runtime:
    fail: set[str] = field(default_factory=set)
    gate: asyncio.Event | None = None
    registered: list[str] = field(default_factory=list)
    unregistered: list[str] = field(default_factory=list)
    running: bool = True
    kind: str = "fake"

    async def add(self, inst: InstanceSpec) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if inst.name in self.fail:
            raise NativeStartError(f"{inst.name}: failed to load")
        self.registered.append(inst.name)

    async def remove(self, name: str) -> None:
        self.unregistered.append(name)

    async def workers(self, name: str) -> list[WorkerState]:
        return [WorkerState(status="READY", pid=1000 + len(name))]


class _Pod:
    def __init__(self, tmp: Path, ts: _Runtime) -> None:
        self.opts = ServeOptions(model="tiny", plan=THIN, drain_seconds=5.0)
        self.name = "tiny"
        self.cpus = [0, 1]
        self.generation = 0
        self.lock = asyncio.Lock()
        self.instances: list[InstanceSpec] = plan_instances(THIN, model="tiny", cores=[[0], [1]])
        self.runtime = ts
        self.dispatcher = Dispatcher(model="tiny", instances=self.instances, backend_url="x")
        for i in range(len(self.instances)):
            self.dispatcher.set_up(i, True)
        self.settings: list[list[str]] = []
        self.warmed: list[str] = []

    def write_settings(self, instances: list[InstanceSpec]) -> None:
        self.settings.append([i.name for i in instances])

    async def warm(self, inst: InstanceSpec) -> None:
        self.warmed.append(inst.name)

    def adopt(self, plan: Plan, instances: Any, pids: Any, *, generation: int) -> None:
        self.opts.plan, self.instances, self.generation = plan, list(instances), generation


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_switch_registers_warms_swaps_then_unregisters_the_old(tmp_path: Path) -> None:
    ts = _Runtime()
    pod = _Pod(tmp_path, ts)

    async def go() -> dict[str, Any]:
        switch = InPodSwitch(pod)  # type: ignore[arg-type]
        doc = await switch.switch(FAT)
        assert pod.dispatcher.instances[0].name == "tiny_g1_i0"  # swapped before the answer
        await switch.close_after_drain()
        return doc

    doc = _run(go())
    assert doc["switched"] and doc["from"] == "2x1t/b2" and doc["plan"] == "1x2t/b4"
    assert ts.registered == ["tiny_g1_i0"] and pod.warmed == ["tiny_g1_i0"]
    assert sorted(ts.unregistered) == ["tiny_i0", "tiny_i1"]
    # Old and new pinned side by side while both run, then only the new.
    assert pod.settings == [["tiny_i0", "tiny_i1", "tiny_g1_i0"], ["tiny_g1_i0"]]
    assert pod.opts.plan.label == "1x2t/b4" and pod.generation == 1


def test_a_failed_start_removes_what_it_registered_and_keeps_the_old_plan(
    tmp_path: Path,
) -> None:
    ts = _Runtime(fail={"tiny_g1_i1"})
    pod = _Pod(tmp_path, ts)
    old_dispatch = pod.dispatcher.instances

    async def go() -> None:
        with pytest.raises(SwitchError) as err:
            await InPodSwitch(pod).switch(_plan(2, 1, 4))  # type: ignore[arg-type]
        assert err.value.status == 503
        assert "still serving 2x1t/b2" in str(err.value)

    _run(go())
    # Both new instances are removed again, the one that failed to start too.
    assert sorted(ts.unregistered) == ["tiny_g1_i0", "tiny_g1_i1"]
    assert pod.dispatcher.instances == old_dispatch and pod.dispatcher.ready
    assert pod.opts.plan.label == "2x1t/b2" and pod.generation == 0
    assert pod.settings[-1] == ["tiny_i0", "tiny_i1"]


def test_a_plan_for_more_cores_is_refused_before_anything_starts(tmp_path: Path) -> None:
    ts = _Runtime()
    pod = _Pod(tmp_path, ts)
    big = Plan.from_dict(
        {
            **THIN.to_dict(),
            "cpus": 4,
            "instances": [{"threads": 1, "batch": 1, "count": 4}],
            "batch": 4,
        }
    )

    async def go() -> None:
        with pytest.raises(SwitchError) as err:
            await InPodSwitch(pod).switch(big)  # type: ignore[arg-type]
        assert err.value.status == 400

    _run(go())
    assert ts.registered == [] and pod.settings == []


def test_the_same_plan_is_no_switch_and_a_second_switch_waits_its_turn(tmp_path: Path) -> None:
    ts = _Runtime(gate=asyncio.Event())
    pod = _Pod(tmp_path, ts)

    async def go() -> None:
        switch = InPodSwitch(pod)  # type: ignore[arg-type]
        assert ts.gate is not None
        ts.gate.set()
        assert (await switch.switch(THIN))["switched"] is False
        ts.gate.clear()
        first = asyncio.ensure_future(switch.switch(FAT))
        while not switch.busy:
            await asyncio.sleep(0.01)
        with pytest.raises(SwitchError) as err:
            await switch.switch(THIN)
        assert err.value.status == 409
        ts.gate.set()
        assert (await first)["switched"] is True
        await switch.close_after_drain()

    _run(go())
