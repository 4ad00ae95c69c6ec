"""``status.measured``: the profiling run's plan-vs-fat measurement, shown only for its plan."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from conftest import NS, T0, profile_json, setup_model
from packrat.bench.verify import format_verification, with_verification
from packrat.controller.core.model import model_spec
from packrat.controller.core.plans import to_status as status_plan
from packrat.controller.core.spec import validate_spec
from packrat.controller.core.status import ModelStatus
from packrat.controller.profiling import manifests as pm
from packrat.controller.profiling.verified import measured, publish
from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import VERIFIED_KEY, Profile, parse_profile

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}}


def _profile() -> Profile:
    return parse_profile(profile_json(), origin="test")


def _record(profile: Profile, batch: int, *, speedup: Any = 1.25) -> dict[str, Any]:
    plan = Optimizer.for_profile(profile, cpus=2, max_batch=batch).plan(batch)
    entry = {
        "batch": batch,
        "label": plan.label,
        "plan": plan.to_dict(),
        "planMs": 2.0,
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
    served = status_plan(Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4))
    got = measured(served, verified)
    assert got is not None
    assert got["speedup"] == "1.25x" and got["batch"] == 4
    assert got["latencyMs"] == 2.0 and got["fatLatencyMs"] == 2.5
    assert got["measuredAt"] == "2026-12-03T20:00:00Z"
    other = status_plan(Optimizer.for_profile(profile, cpus=2, max_batch=2).plan(2))
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
    served = status_plan(Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4))
    assert measured(served, with_verification(profile, bad)) is None


@pytest.mark.parametrize("speedup", [0, -1, float("nan"), float("inf"), "1.2", True])
def test_a_non_positive_or_non_numeric_speedup_is_ignored(speedup: Any) -> None:
    profile = _profile()
    served = status_plan(Optimizer.for_profile(profile, cpus=2, max_batch=4).plan(4))
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


def test_a_served_model_shows_the_measured_speedup_of_its_plan() -> None:
    """End to end through a reconcile pass: the profile the Job printed carries the
    verification; once Ready, status.measured (the Measured column) shows it."""
    profile = _profile()
    text = with_verification(profile, _record(profile, 4)).to_json()
    kube, rec = setup_model()  # the default spec: tiny, 2 cpus, batchSize 4
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
