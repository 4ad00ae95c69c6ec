"""``status.measured``: the profiling run's plan-vs-fat measurement, shown only for its plan."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from kube_support import NS, T0, ModelSetUp, profile_json, setup_model

from packrat.bench.verify import format_verification, with_verification
from packrat.controller.core.model import model_spec
from packrat.controller.core.spec import validate_spec
from packrat.controller.core.status import ModelStatus
from packrat.controller.profiling import manifests as pm
from packrat.controller.profiling.verified import CONDITION, loses_to_fat, measured, publish
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import VERIFIED_KEY, Profile, parse_profile

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}}


def _profile() -> Profile:
    return parse_profile(profile_json(), origin="test")


def _record(
    profile: Profile, batch: int, *, speedup: Any = 1.25, plan_ms: float = 2.0
) -> dict[str, Any]:
    plan = Optimizer.for_profile(profile, cpus=2, max_batch=batch).plan(batch)
    entry = {
        "batch": batch,
        "label": plan.label,
        "plan": plan.to_dict(),
        "planMs": plan_ms,
        "expectedMs": plan.expected_latency_ms,
        "fatMs": 2.5,
        "speedup": speedup,
        "expectedSpeedup": plan.expected_speedup,
    }
    return {"measuredAt": "2026-12-03T20:00:00Z", "repeats": 5, "results": [entry]}


@pytest.mark.parametrize(
    ("extra", "batches"),
    [
        ({"batchSize": 4}, [4]),
        ({"autoBatch": {"min": 2, "max": 8}}, [2, 4, 8]),
        ({"autoBatch": {"min": 3, "max": 5}}, [4]),
        ({"batchSize": 4, "profiling": {"maxBatch": 8, "verify": False}}, []),
        ({"slo": {"latencyP99Ms": 20, "rate": 100}}, []),
    ],
)
def test_the_profiling_run_verifies_the_batches_the_model_may_serve(
    extra: dict[str, Any], batches: list[int]
) -> None:
    spec = {**BASE, **extra}
    assert pm.verify_batches(model_spec(spec)) == batches
    cmd = pm.profile_command(model_spec(spec), output="/p/x")
    assert cmd[-2:] == ["-o", "/p/x"]
    if batches:
        at = cmd.index("--verify-batches")
        assert cmd[at + 1] == ",".join(map(str, batches))
    else:
        assert "--verify-batches" not in cmd


def test_verify_must_be_a_boolean() -> None:
    good = {**BASE, "batchSize": 2, "profiling": {"verify": False}}
    assert validate_spec(good) == []
    assert any("verify" in e for e in validate_spec({**good, "profiling": {"verify": "no"}}))


def test_measured_matches_only_the_verified_plan() -> None:
    profile = _profile()
    verified = with_verification(profile, _record(profile, 4))
    served = Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4)
    got = measured(served, verified)
    assert got is not None
    assert got["speedup"] == "1.25x" and got["batch"] == 4
    assert got["latencyMs"] == 2.0 and got["fatLatencyMs"] == 2.5
    assert got["expectedLatencyMs"] == 1.8  # L(1, 2): the estimate the measurement corrects
    assert got["measuredAt"] == "2026-12-03T20:00:00Z"
    other = Optimizer.for_profile(profile, cpus=2, max_batch=2).plan(2)
    assert measured(other, verified) is None  # another batch: nothing measured for it
    assert measured(served, profile) is None  # no verification in the profile
    assert measured(None, verified) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"results": "x"},
        {"results": [None]},
        {"results": [{"plan": "x", "speedup": 1.2, "planMs": 1, "fatMs": 1}]},
        {"results": [{"plan": {"instances": ["x"]}, "speedup": 1.2}]},
    ],
)
def test_a_malformed_record_is_ignored(bad: dict[str, Any]) -> None:
    profile = _profile()
    served = Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4)
    assert measured(served, with_verification(profile, bad)) is None


@pytest.mark.parametrize("speedup", [0, -1, float("nan"), float("inf"), "1.2", True])
def test_a_non_positive_or_non_numeric_speedup_is_ignored(speedup: Any) -> None:
    profile = _profile()
    served = Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4)
    record = _record(profile, 4, speedup=speedup)
    assert measured(served, with_verification(profile, record)) is None


def test_publish_drops_a_stale_measurement() -> None:
    profile = _profile()
    status = ModelStatus({"plan": {"cpus": 2, "batch": 1}, "measured": {"speedup": "9x"}})
    publish(status, profile)
    assert "measured" not in status


def test_format_verification() -> None:
    profile = _profile()
    text = format_verification(_record(profile, 4))
    assert "B=4" in text and "1.25x measured" in text
    assert "failed" in format_verification({"error": "boom"})


def test_a_served_model_shows_the_measured_speedup_of_its_plan(new_model: ModelSetUp) -> None:
    """End to end through a reconcile pass: the profile the Job printed carries the
    verification; once Ready, status.measured (the Measured column) shows it."""
    profile = _profile()
    text = with_verification(profile, _record(profile, 4)).to_json()
    kube, rec = new_model  # the default spec: tiny, 2 cpus, batchSize 4
    rec.reconcile(NS, "tiny", now=T0)
    job = next(v for (r, _, _), v in kube.objects.items() if r == "jobs")
    cmd = job["spec"]["template"]["spec"]["initContainers"][-1]["command"]
    assert cmd[cmd.index("--verify-batches") + 1] == "4"
    kube.finish_job(ok=True, log=text)
    rec.reconcile(NS, "tiny", now=T0)
    kube.make_ready("tiny-a")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    obj = kube.get("packratmodels", NS, "tiny")
    assert obj is not None
    status = obj["status"]
    assert status["phase"] == "Ready"
    assert status["measured"]["speedup"] == "1.25x"
    assert VERIFIED_KEY == "verified"


def test_with_verification_keeps_the_profile() -> None:
    profile = _profile()
    out = with_verification(profile, {"measuredAt": "t", "error": "x"})
    assert out.points == profile.points
    assert out.meta.extra[VERIFIED_KEY] == {"measuredAt": "t", "error": "x"}
    assert dataclasses.replace(out.meta, extra={}) == dataclasses.replace(profile.meta, extra={})


def _served(record: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A model through reconcile passes to Ready with a profile carrying ``record``: its
    status and every event of the passes."""
    text = with_verification(_profile(), record).to_json()
    kube, rec = setup_model()  # tiny, 2 cpus, batchSize 4: the optimizer's plan is 2x1t/b2
    events = list(rec.reconcile(NS, "tiny", now=T0).events)
    kube.finish_job(ok=True, log=text)
    events += rec.reconcile(NS, "tiny", now=T0).events
    kube.make_ready("tiny-a")
    for k in range(1, 3):  # at rest: the refusal is stable, its event not repeated
        events += rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=k)).events
    obj = kube.get("packratmodels", NS, "tiny")
    assert obj is not None
    return obj["status"], events


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == CONDITION)


def test_a_plan_slower_than_fat_is_not_served() -> None:
    """Measured 3.0 ms against fat's 2.5 ms (0.83x, beyond the 5% noise): the fat instance
    is served, the condition and one event say so, and the Measured column keeps 0.83x."""
    status, events = _served(_record(_profile(), 4, speedup=2.5 / 3.0, plan_ms=3.0))
    assert status["phase"] == "Ready"
    assert status["plan"]["label"] == "1x2t/b4"  # the fat instance
    assert status["plan"]["instances"] == [
        {"threads": 2, "batch": 4, "count": 1, "latency_ms": 2.2}
    ]
    cond = _condition(status)
    assert cond["status"] == "False" and cond["reason"] == "SlowerThanFat"
    assert "2x1t/b2" in cond["message"] and "serving the fat instance 1x2t/b4" in cond["message"]
    warnings = [e for e in events if e[1] == "PlanSlowerThanFat"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning"
    assert status["measured"]["speedup"] == "0.83x"
    assert status["measured"]["refusedPlan"] == "2x1t/b2"


@pytest.mark.parametrize("plan_ms", [2.0, 2.6])  # faster; slower but within the noise
def test_a_plan_not_slower_than_fat_beyond_noise_is_served(plan_ms: float) -> None:
    status, events = _served(_record(_profile(), 4, speedup=2.5 / plan_ms, plan_ms=plan_ms))
    assert status["plan"]["label"] == "2x1t/b2"
    cond = _condition(status)
    assert cond["status"] == "True" and cond["reason"] == "NotSlowerThanFat"
    assert not [e for e in events if e[1] == "PlanSlowerThanFat"]
    assert "refusedPlan" not in status["measured"]


def test_loses_to_fat_is_beyond_noise_only() -> None:
    assert loses_to_fat({"latencyMs": 2.63, "fatLatencyMs": 2.5})
    assert not loses_to_fat({"latencyMs": 2.62, "fatLatencyMs": 2.5})
