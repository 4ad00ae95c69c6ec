"""autoBatch glue: status <-> observations, annotations, optimizer cache, reading estimates, and
the reconcile pass driving ``plan.reconfig`` end to end against an in-memory API."""

from __future__ import annotations

from typing import Any

import pytest
from kube_support import (
    NS,
    FakeFanout,
    FakeKube,
    Feed,
    add_model,
    after,
    finish_switch,
    profile_json,
    to_ready,
    unbatched_spec,
)

from packrat.controller.core.model import AutoBatch, model_spec
from packrat.controller.core.status import BatchRecord
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning import estimates
from packrat.controller.planning.batching import FAST_DUE_MARGIN
from packrat.plan.profile import parse_profile
from packrat.plan.reconfig import FastPolicy, Outcome

AUTO: dict[str, Any] = {
    "min": 1,
    "max": 8,
    "sustainObservations": 2,
    "minIntervalSeconds": 60,
    "minGain": 0.05,
}


def _auto(auto: dict[str, Any]) -> AutoBatch:
    typed = model_spec({"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": auto}).auto
    assert typed is not None
    return typed


# -- pure glue ------------------------------------------------------------------------------------
def test_policy_from_spec_maps_every_field() -> None:
    policy = ab.policy_from_spec(_auto(AUTO))
    assert (policy.min_batch, policy.max_batch, policy.sustain) == (1, 8, 2)
    assert (policy.min_interval_s, policy.min_gain) == (60.0, 0.05)
    assert ab.policy_from_spec(_auto({})).min_gain == 0.05  # default 5 %


@pytest.mark.parametrize(
    ("annotations", "pin", "error"),
    [
        (None, None, False),
        ({}, None, False),
        ({ab.PIN_ANNOTATION: "4"}, 4, False),
        ({ab.PIN_ANNOTATION: " 16 "}, 16, False),
        ({ab.PIN_ANNOTATION: ""}, None, False),
        ({ab.PIN_ANNOTATION: "four"}, None, True),
        ({ab.PIN_ANNOTATION: "0"}, None, True),
    ],
)
def test_parse_pin(annotations: dict[str, str] | None, pin: int | None, error: bool) -> None:
    value, why = ab.parse_pin(annotations)
    assert value == pin
    assert (why is not None) == error


def test_reconfigure_trigger_fires_once_per_value() -> None:
    ann = {ab.RECONFIGURE_ANNOTATION: "1"}
    handled = BatchRecord(reconfigure_handled="1")
    assert ab.pending_trigger(ann, BatchRecord()) == "1"
    assert ab.pending_trigger(ann, handled) is None
    assert ab.pending_trigger({ab.RECONFIGURE_ANNOTATION: "2"}, handled) == "2"
    assert ab.pending_trigger({}, BatchRecord()) is None


def test_as_reading_normalises_sources() -> None:
    assert ab.as_reading(None) is None
    assert ab.as_reading(4) == ab.Reading((4,), "service")
    assert ab.as_reading([2, 8, 8]) == ab.Reading((2, 8, 8), "pods")
    reading = ab.Reading((2, 8, 8, 2), "pods")
    assert ab.as_reading(reading) is reading
    assert reading.combined == 8  # mode, ties to the larger batch
    assert ab.Reading((), "pods").combined is None


def test_record_observation_keeps_the_last_sustain_readings() -> None:
    policy = ab.policy_from_spec(_auto({**AUTO, "sustainObservations": 3}))
    seen = BatchRecord.from_status({"current": 2, "streak": 3})
    for i, batch in enumerate([1, 8, 32, 4]):
        now = f"2026-01-01T00:00:0{i}Z"
        seen = ab.record_observation(
            seen, reading=ab.Reading((batch, batch), "pods"), policy=policy, now=now
        )
        if batch == 32:  # clamped to the range's maximum; the raw values are kept
            assert seen.observed == 8 and seen.estimates == (32, 32)
    assert [batch for batch, _ in seen.recent] == [8, 8, 4]
    assert seen.observed == 4 and seen.observed_at == "2026-01-01T00:00:03Z"
    assert seen.estimates == (4, 4) and seen.source == "pods"
    doc = seen.to_status()
    assert doc["current"] == 2 and "streak" not in doc
    assert BatchRecord.from_status(doc) == seen
    obs = ab.observations(seen)
    assert [o.batch for o in obs] == [8, 8, 4]
    assert obs[1].time - obs[0].time == 1.0
    # an empty reading changes nothing
    assert (
        ab.record_observation(seen, reading=ab.Reading((), "pods"), policy=policy, now="x") == seen
    )


def test_observations_skip_malformed_entries() -> None:
    status = {"recent": [{"batch": 2, "time": "2026-01-01T00:00:00Z"}, {"batch": "x"}, 5]}
    assert [o.batch for o in ab.observations(BatchRecord.from_status(status))] == [2]


def test_switch_history_is_bounded() -> None:
    history: list[dict[str, Any]] = []
    for i in range(15):
        history = ab.append_history(history, {"toBatch": i})
    assert len(history) == ab.HISTORY_LIMIT == 10
    assert [h["toBatch"] for h in history] == list(range(5, 15))


def test_optimizer_cache_solves_once_per_key() -> None:
    profile = parse_profile(profile_json(), origin="test")
    cache = ab.OptimizerCache(size=2)
    first = cache.optimizer(profile, digest="d1", cpus=2, max_batch=8)
    assert cache.optimizer(profile, digest="d1", cpus=2, max_batch=8) is first
    assert cache.misses == 1
    cache.optimizer(profile, digest="d2", cpus=2, max_batch=8)
    assert cache.optimizer(profile, digest="d1", cpus=2, max_batch=8) is first  # now most recent
    cache.optimizer(profile, digest="d1", cpus=2, max_batch=4)  # evicts d2 (least recent)
    assert cache.misses == 3
    assert cache.optimizer(profile, digest="d1", cpus=2, max_batch=8) is first
    cache.optimizer(profile, digest="d2", cpus=2, max_batch=8)
    assert cache.misses == 4


def test_parse_estimate_and_pod_ready() -> None:
    assert ab.parse_estimate({"batch_size_estimate": {"estimate": 8, "ewma": 9.1}}) == 8
    assert ab.parse_estimate({"batch_size_estimate": {"estimate": 0}}) is None
    assert ab.parse_estimate({}) is None
    assert ab.parse_estimate([]) is None
    ready: dict[str, Any] = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert ab.pod_ready(ready)
    assert not ab.pod_ready({**ready, "metadata": {"deletionTimestamp": "now"}})
    unready = {"status": {**ready["status"], "conditions": [{"type": "Ready", "status": "False"}]}}
    assert not ab.pod_ready(unready)
    assert not ab.pod_ready({"status": {**ready["status"], "podIP": ""}})


def _serving_pod(name: str, *, slot: str, ready: bool, ip: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/instance": "m", "packrat.dev/slot": slot},
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_estimate_reader_reads_every_ready_pod_the_service_selects(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, fanout: FakeFanout
) -> None:
    kube.create(
        "services",
        NS,
        {
            "metadata": {"name": "m"},
            "spec": {"selector": {"app.kubernetes.io/instance": "m", "packrat.dev/slot": "a"}},
        },
    )
    kube.create("pods", NS, _serving_pod("m-a-1", slot="a", ready=True, ip="10.0.0.1"))
    kube.create("pods", NS, _serving_pod("m-a-2", slot="a", ready=True, ip="10.0.0.2"))
    kube.create("pods", NS, _serving_pod("m-a-3", slot="a", ready=False, ip="10.0.0.3"))
    kube.create("pods", NS, _serving_pod("m-b-1", slot="b", ready=True, ip="10.0.0.4"))
    fanout.estimates.update(
        {"http://10.0.0.1:8080": 8, "http://10.0.0.2:8080": 4, "http://svc/m": 2}
    )
    reader = estimates.EstimateReader(
        kube,
        pod_url="http://{ip}:8080",
        service_url="http://svc/{service}",
        fanout=fanout,  # type: ignore[arg-type]
    )
    assert reader(NS, "m") == ab.Reading((8, 4), "pods")
    assert sorted(fanout.asked) == ["http://10.0.0.1:8080/status", "http://10.0.0.2:8080/status"]
    # no ready pods listed: one reading through the Service
    for pod in ("m-a-1", "m-a-2"):
        kube.delete("pods", NS, pod)
    assert reader(NS, "m") == ab.Reading((2,), "service")
    fanout.estimates.clear()
    assert reader(NS, "m") is None


# -- the reconcile pass, end to end on an in-memory API --------------------------------------------
def _auto_model(**auto: Any) -> tuple[FakeKube, Reconciler, Feed]:
    kube, feed = FakeKube(), Feed()
    rec = add_model(kube, unbatched_spec(autoBatch={**AUTO, **auto}), estimates=feed)
    assert to_ready(kube, rec).phase == "Ready"
    return kube, rec, feed


def _batch(kube: FakeKube) -> dict[str, Any]:
    value: dict[str, Any] = kube.prm()["status"]["batchSize"]
    return value


def _annotate(kube: FakeKube, **annotations: str) -> None:
    kube.patch("packratmodels", NS, "tiny", {"metadata": {"annotations": annotations}})


def test_sustained_load_switches_once_through_the_active_passive_switch() -> None:
    kube, rec, feed = _auto_model()
    assert _batch(kube)["current"] == 1
    feed.next = [8, 8, 2]  # three pods; the mode is 8
    res = rec.reconcile(NS, "tiny", now=after(1))
    assert res.decision == Outcome.HOLD_NOT_SUSTAINED and res.observed_batch == 8
    seen = _batch(kube)
    assert seen["observed"] == 8 and seen["estimates"] == [8, 8, 2] and seen["source"] == "pods"
    assert seen["lastDecision"]["outcome"] == "hold_not_sustained" and "target" not in seen
    res = rec.reconcile(NS, "tiny", now=after(2))
    assert res.decision == Outcome.SWITCH
    assert [e[1] for e in res.events] == ["BatchSizeChanged"]
    seen = _batch(kube)
    assert seen["target"] == 8 and seen["lastDecision"]["expectedGain"] > 0.05
    assert "batch 1 -> 8" in seen["lastDecision"]["message"]
    res = rec.reconcile(NS, "tiny", now=after(3))
    assert res.phase == "Reconfiguring"
    assert kube.prm()["status"]["switch"]["plan"]["batch"] == 8
    assert _batch(kube) == {**seen, "current": 1, "target": 8}  # no observations mid-switch
    done = finish_switch(kube, rec, at=4)
    assert done.switch_seconds is not None
    status = kube.prm()["status"]
    assert status["batchSize"]["current"] == 8 and "target" not in status["batchSize"]
    (entry,) = status["switchHistory"]
    assert (entry["fromBatch"], entry["toBatch"], entry["result"]) == (1, 8, "Succeeded")
    # the load stays: holds, and the DP was solved once for all these passes
    res = rec.reconcile(NS, "tiny", now=after(20))
    assert res.decision == Outcome.HOLD_SAME
    assert rec.optimizers.misses == 1


def test_a_change_soon_after_a_switch_waits_and_a_trigger_skips_the_wait() -> None:
    kube, rec, feed = _auto_model()
    feed.next = [8]
    rec.reconcile(NS, "tiny", now=after(1))
    rec.reconcile(NS, "tiny", now=after(2))
    rec.reconcile(NS, "tiny", now=after(3))
    finish_switch(kube, rec, at=4)  # lastSwitch at t=14
    feed.next = [1]
    rec.reconcile(NS, "tiny", now=after(15))
    res = rec.reconcile(NS, "tiny", now=after(16))
    assert res.decision == Outcome.HOLD_TOO_SOON
    assert "next allowed in" in _batch(kube)["lastDecision"]["message"]
    _annotate(kube, **{ab.RECONFIGURE_ANNOTATION: "now-please"})
    res = rec.reconcile(NS, "tiny", now=after(17))
    assert res.decision == Outcome.SWITCH
    seen = _batch(kube)
    assert seen["target"] == 1 and seen["reconfigureHandled"] == "now-please"
    assert seen["lastDecision"]["trigger"] == f"{ab.RECONFIGURE_ANNOTATION}=now-please"
    assert rec.reconcile(NS, "tiny", now=after(18)).phase == "Reconfiguring"
    finish_switch(kube, rec, at=19)
    assert [h["toBatch"] for h in kube.prm()["status"]["switchHistory"]] == [8, 1]
    # the same annotation value does not trigger again; the interval applies once more
    feed.next = [4]
    rec.reconcile(NS, "tiny", now=after(40))
    assert rec.reconcile(NS, "tiny", now=after(41)).decision == Outcome.HOLD_TOO_SOON


def test_small_gains_hold() -> None:
    kube, rec, feed = _auto_model(minGain=0.9)
    feed.next = [8]
    rec.reconcile(NS, "tiny", now=after(1))
    res = rec.reconcile(NS, "tiny", now=after(2))
    assert res.decision == Outcome.HOLD_GAIN_TOO_SMALL
    assert "target" not in _batch(kube)
    assert rec.reconcile(NS, "tiny", now=after(3)).phase == "Ready"


def test_pin_switches_once_then_holds_whatever_the_load() -> None:
    kube, rec, feed = _auto_model(sustainObservations=5)
    _annotate(kube, **{ab.PIN_ANNOTATION: "2"})
    res = rec.reconcile(NS, "tiny", now=after(1))  # no reading needed, no sustain
    assert res.decision == Outcome.SWITCH and _batch(kube)["target"] == 2
    assert "pinned" in _batch(kube)["lastDecision"]["message"]
    rec.reconcile(NS, "tiny", now=after(2))
    finish_switch(kube, rec, at=3)
    feed.next = [8]
    for t in range(20, 30):
        res = rec.reconcile(NS, "tiny", now=after(t))
        assert res.decision == Outcome.HOLD_PINNED, res
    assert _batch(kube)["current"] == 2 and len(kube.prm()["status"]["switchHistory"]) == 1
    # unpinned: the sustained load takes over again (interval long passed)
    _annotate(kube, **{ab.PIN_ANNOTATION: None})  # type: ignore[arg-type]
    decisions = [rec.reconcile(NS, "tiny", now=after(t)).decision for t in range(100, 105)]
    assert decisions.count(Outcome.SWITCH) == 1 and _batch(kube)["target"] == 8


def test_a_bad_pin_is_reported_and_ignored() -> None:
    kube, rec, feed = _auto_model()
    _annotate(kube, **{ab.PIN_ANNOTATION: "lots"})
    feed.next = [1]
    res = rec.reconcile(NS, "tiny", now=after(1))
    assert res.decision == Outcome.HOLD_NOT_SUSTAINED
    assert "not an integer" in _batch(kube)["lastDecision"]["message"]
    assert any(e[1] == "BadAnnotation" for e in res.events)


def test_no_estimates_no_decision() -> None:
    kube, rec, _ = _auto_model()
    res = rec.reconcile(NS, "tiny", now=after(1))
    assert res.decision is None and res.observed_batch is None
    assert "lastDecision" not in _batch(kube)


# -- the fast trigger (issue 27 item 4) ------------------------------------------------------------
def test_parse_pod_estimate_validates_the_fast_triggers_evidence() -> None:
    def doc(**extra: Any) -> dict[str, Any]:
        return {"batch_size_estimate": {"estimate": 4, **extra}}

    good = ab.parse_pod_estimate(doc(stable_seconds=1.5, batches={"full": 3, "timeout": 9}))
    assert good == ab.PodEstimate(4, 1.5, (3, 9))
    for bad in (float("nan"), float("inf"), -1, True, "2", 1e12):
        assert ab.parse_pod_estimate(doc(stable_seconds=bad)) == ab.PodEstimate(4, None, None)
    for counts in ({"full": -1, "timeout": 0}, {"full": True, "timeout": 0}, {"full": 1},
                   {"full": 2**60, "timeout": 0}, [1, 2], {"full": 1.5, "timeout": 0}):  # fmt: skip
        assert ab.parse_pod_estimate(doc(batches=counts)) == ab.PodEstimate(4, None, None)
    assert ab.parse_pod_estimate(doc(estimate=0)) is None
    # a round's evidence only when every pod gave it: the smallest hold, the summed counts
    both = [ab.PodEstimate(4, 2.0, (1, 2)), ab.PodEstimate(4, 0.5, (10, 20))]
    assert ab.reading_of(both, "pods") == ab.Reading((4, 4), "pods", 0.5, (11, 22))
    mixed = [ab.PodEstimate(4, 2.0, (1, 2)), ab.PodEstimate(8, None, None)]
    assert ab.reading_of(mixed, "pods") == ab.Reading((4, 8), "pods")
    assert ab.reading_of([], "pods") is None


def test_fast_trigger_switches_on_one_held_reading_and_on_frequent_batch_timeouts() -> None:
    kube, rec, feed = _auto_model(sustainObservations=5, sustainSeconds=1)
    feed.next = ab.Reading((8,), "pods", stable_s=0.3)
    held = rec.reconcile(NS, "tiny", now=after(1))
    assert held.decision == Outcome.HOLD_NOT_SUSTAINED
    # read again when it has held 1 s (0.7 s from now, and a margin)
    assert held.retry_seconds == pytest.approx(0.7 + FAST_DUE_MARGIN)
    feed.next = ab.Reading((8,), "pods", stable_s=1.5)  # held a second: no third observation
    res = rec.reconcile(NS, "tiny", now=after(2))
    assert res.decision == Outcome.SWITCH
    assert res.retry_seconds == 0.0  # the switch starts on the next pass, at once
    assert held.retry_seconds != 0.0
    assert _batch(kube)["lastDecision"]["fast"].startswith("sustained")
    assert _batch(kube)["fast"]["lastFrom"] == 1
    assert rec.reconcile(NS, "tiny", now=after(3)).phase == "Reconfiguring"
    finish_switch(kube, rec, at=4)  # lastSwitch at t=14
    # the load falls; batches leave on their timeout rather than full
    feed.next = ab.Reading((1,), "pods", stable_s=0.1, batches=(0, 0))
    assert rec.reconcile(NS, "tiny", now=after(15)).decision == Outcome.HOLD_NOT_SUSTAINED
    feed.next = ab.Reading((1,), "pods", stable_s=0.2, batches=(5, 40))
    res = rec.reconcile(NS, "tiny", now=after(16))  # frequent, but 2 s after the last switch
    assert res.decision == Outcome.HOLD_NOT_SUSTAINED
    assert _batch(kube)["fast"]["timeoutFraction"] == round(40 / 45, 4)
    feed.next = ab.Reading((1,), "pods", stable_s=0.3, batches=(5, 60))
    res = rec.reconcile(NS, "tiny", now=after(20))  # 1 is the batch the last switch left:
    assert res.decision == Outcome.HOLD_NOT_SUSTAINED  # back to it only after 60 s
    feed.next = ab.Reading((1,), "pods", stable_s=0.3, batches=(5, 80))
    res = rec.reconcile(NS, "tiny", now=after(75))  # 61 s after the switch: allowed
    assert res.decision == Outcome.SWITCH and _batch(kube)["target"] == 1
    assert _batch(kube)["lastDecision"]["fast"].startswith("timeouts")
    assert _batch(kube)["fast"]["armed"] is False  # until the fraction falls to 0.2


def test_without_sustain_seconds_a_held_reading_waits_for_the_observations() -> None:
    kube, rec, feed = _auto_model(sustainObservations=3, sustainSeconds=0)  # off
    feed.next = ab.Reading((8,), "pods", stable_s=30.0, batches=(0, 10_000))
    assert rec.reconcile(NS, "tiny", now=after(1)).decision == Outcome.HOLD_NOT_SUSTAINED
    assert rec.reconcile(NS, "tiny", now=after(2)).decision == Outcome.HOLD_NOT_SUSTAINED
    assert "fast" not in _batch(kube)


def test_a_look_between_passes_wakes_a_pass_only_on_news() -> None:
    """:func:`ab.peek_wake`: steady pods never wake a pass; a new combined estimate, changed
    pods (or none answering) and frequent batch timeouts do."""
    fast = FastPolicy(sustain_s=1.0, min_batches=20, timeout_high=0.5, timeout_low=0.2)
    basis = ab.Reading((4, 4), "pods", stable_s=3.0, batches=(100, 10))
    steady = ab.Reading((4, 4), "pods", stable_s=4.0, batches=(130, 20))  # 10 of 40: few
    assert ab.peek_wake(basis, steady, fast) is None
    assert ab.peek_wake(basis, ab.Reading((4, 4), "pods"), fast) is None  # no counts: no news
    moved = ab.Reading((8, 8), "pods", stable_s=0.2, batches=(110, 10))
    assert ab.peek_wake(basis, moved, fast) == ("estimate", "estimate 4 -> 8")
    assert ab.peek_wake(basis, None, fast) == ("pods", "the pods changed")
    assert ab.peek_wake(basis, ab.Reading((4,), "pods"), fast) == ("pods", "the pods changed")
    restarted = ab.Reading((4, 4), "pods", batches=(5, 0))
    assert ab.peek_wake(basis, restarted, fast) == ("pods", "the pods' batch counts restarted")
    timeouts = ab.Reading((4, 4), "pods", batches=(105, 25))  # 15 of 20 on their timeout
    assert ab.peek_wake(basis, timeouts, fast) == (
        "timeouts",
        "15 of 20 batches left on their timeout",
    )
    too_few = ab.Reading((4, 4), "pods", batches=(101, 18))  # 8 of 9
    assert ab.peek_wake(basis, too_few, fast) is None
