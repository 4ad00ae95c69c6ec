"""The typed records of ``status.provisioning``, ``status.autoscaling`` and ``status.canary``
(``core/status.py``): their steps, their status form (the keys the operator wrote before
they were typed) and round trips through the status edge."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.status import (
    AutoscalingRecord,
    CanaryPhase,
    CanaryRecord,
    ModelStatus,
    ProvisioningRecord,
)

ANSWER = ProvisioningRecord(
    signature="s1",
    replicas=3,
    figures={"cpusPerReplica": 2, "batch": 4, "simulatedP99Ms": None, "baselines": {"fat": {}}},
)


def test_a_replan_keeps_the_measured_p99_and_drops_the_old_figures() -> None:
    before = ProvisioningRecord.from_status(
        {"signature": "s0", "replicas": 1, "batch": 8, "measuredP99Ms": 12.5, "old": 1}
    )
    after = before.replanned(ANSWER)
    assert (after.signature, after.replicas, after.measured_p99_ms) == ("s1", 3, 12.5)
    doc = after.to_status()
    assert doc == {
        "signature": "s1",
        "replicas": 3,
        "cpusPerReplica": 2,
        "batch": 4,
        "simulatedP99Ms": None,  # the planner's None is written, as before
        "baselines": {"fat": {}},
        "measuredP99Ms": 12.5,
    }
    assert list(doc)[:2] == ["signature", "replicas"] and list(doc)[-1] == "measuredP99Ms"
    assert ProvisioningRecord.from_status(doc) == after
    assert "measuredP99Ms" not in ProvisioningRecord().replanned(ANSWER).to_status()


@pytest.mark.parametrize("doc", [None, "x", {}, {"replicas": "3"}])
def test_no_provisioning_has_no_planned_replicas(doc: Any) -> None:
    assert ProvisioningRecord.from_status(doc).replicas is None


def _decision(replicas: int, previous: int, time: str) -> dict[str, Any]:
    return {"time": time, "action": "hold", "replicas": replicas, "previous": previous}


def test_the_tuner_record_keeps_its_count_per_reference() -> None:
    planned, startup = {"replicas": 2}, {"seconds": 0.0}
    first = AutoscalingRecord().for_reference("r1").tuning(planned=planned, startup=startup)
    held = first.holding(2)
    assert held.to_status() == {
        "signature": "r1",
        "mode": "envelope",
        "planned": planned,
        "startup": startup,
        "replicas": 2,
    }
    assert held.serves("r1") == 2 and held.serves("r2") is None
    up = held.decided(envelope={"pods": 1}, decision=_decision(4, 2, "t1"))
    assert up.replicas == 4 and up.last_scale == _decision(4, 2, "t1")
    same = up.decided(envelope={"pods": 1}, decision=_decision(4, 4, "t2"))
    assert same.last_decision == _decision(4, 4, "t2")
    assert same.last_scale == _decision(4, 2, "t1")  # kept until the count changes again
    assert AutoscalingRecord.from_status(same.to_status()) == same
    assert same.for_reference("r1") is same
    assert same.for_reference("r2") == AutoscalingRecord(signature="r2")  # a new tuner
    assert AutoscalingRecord().serves(None) is None


def test_unknown_tuner_fields_survive_a_round_trip() -> None:
    doc = {"signature": "r1", "replicas": 3, "newerField": [1]}
    assert AutoscalingRecord.from_status(doc).to_status() == doc


def test_a_canary_starts_progresses_and_rolls_back() -> None:
    model = {"uri": "s3://b/m"}
    state = (
        CanaryRecord().for_canary("h1", now="t0").running(model=model, percent=25, ready_replicas=0)
    )
    assert state.starting().to_status() == {
        "hash": "h1",
        "since": "t0",
        "model": model,
        "trafficPercent": 25,
        "readyReplicas": 0,
        "phase": "Starting",
    }
    seen = state.counted(told_all=True, requests=10, errors=1, p99_ms=None, message="")
    assert seen.progressing and seen.for_canary("h1", now="t9") is seen
    doc = seen.to_status()
    assert doc["p99Ms"] is None and doc["requests"] == 10 and doc["message"] == ""
    assert type(doc["phase"]) is str and doc["phase"] == "Progressing"
    assert CanaryRecord.from_status(doc) == seen
    rolled = seen.rolled_back("canary rolled back: too many errors")
    assert rolled.rolled_back_for("h1") and not rolled.rolled_back_for("h2")
    assert rolled.to_status()["trafficPercent"] == 0
    assert rolled.phase is CanaryPhase.ROLLED_BACK
    fresh = rolled.for_canary("h2", now="t1")
    assert fresh == CanaryRecord(hash="h2", since="t1")


def test_a_canary_not_yet_stopped_says_why_and_settles_without_a_share() -> None:
    assert CanaryRecord().stopping("stopping: p1: 503").to_status() == {
        "message": "stopping: p1: 503"
    }
    kept = CanaryRecord.from_status({"hash": "h", "phase": "RolledBack", "trafficPercent": 5})
    assert kept is not None and kept.settled().to_status()["trafficPercent"] == 0
    other = CanaryRecord.from_status({"phase": "Paused", "newer": 1})
    assert other is not None and other.to_status() == {"phase": "Paused", "newer": 1}


def test_the_status_edge_reads_and_writes_the_typed_parts() -> None:
    status = ModelStatus({"autoscaling": {"signature": "r", "replicas": 2, "mode": "envelope"}})
    assert status.provisioning == ProvisioningRecord() and status.canary is None
    assert status.autoscaling.serves("r") == 2
    status.set_provisioning(ANSWER)
    assert status["provisioning"]["cpusPerReplica"] == 2 and status.provisioning == ANSWER
    status.set_canary(CanaryRecord(hash="h"))
    assert status["canary"] == {"hash": "h"} and status.canary == CanaryRecord(hash="h")
    status.set_canary(None)
    assert "canary" not in status and status.canary is None
    status.set_autoscaling(status.autoscaling.holding(5))
    assert status["autoscaling"]["replicas"] == 5
