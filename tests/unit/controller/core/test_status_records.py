"""The typed records of a model's status (``core/status.py``) and the status edge that
converts them: a switch's stages and steps, round trips, and the batch and served reads."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.model import model_spec
from packrat.controller.core.plans import to_status
from packrat.controller.core.status import ModelStatus, ProfileRecord, Stage, Switch
from packrat.plan.optimizer import Plan, PlanError

PLAN = Plan.from_dict(
    {
        "label": "2x1",
        "cpus": 2,
        "batch": 4,
        "instances": [{"threads": 1, "batch": 2, "count": 2}],
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.5,
        "expected_speedup": 1.5,
        "num_instances": 2,
        "total_threads": 2,
    }
)


def _rollout() -> Switch:
    return Switch.rollout(
        from_slot="a",
        target_slot="b",
        serving_hash="h1",
        spec={"cpus": 2},
        reason="plan x -> y",
        started_at="2026-01-01T00:00:00Z",
        plan=PLAN,
    )


def test_a_switch_goes_rollout_draining_and_round_trips() -> None:
    switch = _rollout()
    doc = switch.to_status()
    assert doc == {
        "stage": "rollout",
        "fromSlot": "a",
        "targetSlot": "b",
        "hash": "h1",
        "spec": {"cpus": 2},
        "reason": "plan x -> y",
        "startedAt": "2026-01-01T00:00:00Z",
        "plan": to_status(PLAN),
    }
    assert Switch.from_status(doc) == switch
    moved = switch.moved(ready_seconds=1.5, switched_seconds=2.0, drain_until="later")
    assert moved.stage is Stage.DRAINING and moved.under_way
    assert moved.to_status()["drainUntil"] == "later"
    assert Switch.from_status(moved.to_status()) == moved
    with pytest.raises(AssertionError):
        moved.moved(ready_seconds=1, switched_seconds=1, drain_until="x")


def test_an_aborted_switch_keeps_only_what_stops_a_retry() -> None:
    aborted = _rollout().aborted("not ready")
    assert aborted.to_status() == {
        "stage": "aborted",
        "targetSlot": "b",
        "hash": "h1",
        "reason": "not ready",
    }
    assert aborted.gave_up_on("h1") and not aborted.gave_up_on("h2")
    assert not aborted.under_way and not _rollout().gave_up_on("h1")
    assert aborted.plan_label == "" and aborted.plan_batch is None


@pytest.mark.parametrize("doc", [None, {}, "x", {"stage": "bogus"}, {"stage": None}])
def test_no_switch_or_an_unknown_stage_is_none(doc: Any) -> None:
    assert Switch.from_status(doc) is None


def test_unknown_fields_survive_a_round_trip() -> None:
    doc = {**_rollout().to_status(), "newerField": {"x": 1}}
    assert Switch.from_status(doc).to_status() == doc  # type: ignore[union-attr]


def test_the_status_edge_reads_typed_parts() -> None:
    status = ModelStatus(
        {
            "batchSize": {"current": 2, "target": 8, "observed": 8},
            "profile": {"digest": "d1"},
            "plan": to_status(PLAN),
            "switch": _rollout().to_status(),
        }
    )
    assert (status.batch_current, status.batch_target, status.profile_digest) == (2, 8, "d1")
    assert status.served_plan == PLAN and status.switch == _rollout()
    status.batch_settled(8)
    assert (status.batch_current, status.batch_target) == (8, None)
    assert status.batch.observed == 8 and status["batchSize"]["observed"] == 8
    status.set_switch(None)
    assert status.switch is None and "switch" not in status
    assert ModelStatus({}).profile_digest == "" and ModelStatus({}).served_plan is None
    with pytest.raises(PlanError):
        Plan.from_dict({})


def test_the_served_spec_is_typed_once_per_kept_spec() -> None:
    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4, "profiling": {"maxBatch": 8}}
    status = ModelStatus({"servingSpec": spec})
    meta = {"name": "m", "namespace": "ns"}
    first = status.served_spec(meta, image="img")
    assert first is not None and first.cpus == 2
    assert status.served_spec(meta, image="img") is first  # not parsed again
    status.keep_serving_spec({"x": 1})  # kept already: unchanged
    assert status.served_spec(meta, image="img") is first
    other = model_spec({**spec, "cpus": 4})
    status.set_serving(slot="a", serving_hash="h", plan=PLAN, serving_spec=other.stored_spec())
    again = status.served_spec(meta, image="img")
    assert again is not None and again.cpus == 4
    assert ModelStatus({}).served_spec(meta, image="img") is None


def test_a_profile_record_moves_through_its_attempts() -> None:
    record = ProfileRecord.from_status({"key": "k1", "configMap": "cm", "digest": "d"})
    assert record.for_key("k1") is record
    fresh = record.for_key("k2")
    assert fresh.to_status() == {"key": "k2"}
    started = fresh.started(job="j", started_at="t0")
    failed = started.failed_attempt(failure="oom", retry_at="t1")
    assert failed.to_status() == {
        "key": "k2",
        "startedAt": "t0",
        "attempts": 1,
        "lastFailure": "oom",
        "retryAt": "t1",
    }
    again = failed.started(job="j", started_at="t2").stuck_on("unschedulable")
    assert again.retry_at is None and again.stuck == "unschedulable"
    assert again.gave_up(3).fresh_start().to_status() == {
        "key": "k2",
        "job": "j",
        "startedAt": "t2",
        "lastFailure": "oom",
        "stuck": "unschedulable",
    }
    stored = again.stored(config_map="cm2", digest="d2", cpu_model="cpu", mode=None)
    assert stored.to_status() == {
        "key": "k2",
        "configMap": "cm2",
        "digest": "d2",
        "cpuModel": "cpu",
        "startedAt": "t2",
    }
    assert ProfileRecord.from_status(stored.to_status()) == stored
    assert ProfileRecord.from_status(None) == ProfileRecord()
    assert ProfileRecord.from_status({"key": "k", "new": 1}).to_status() == {"key": "k", "new": 1}
