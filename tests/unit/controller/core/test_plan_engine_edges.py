"""The plan's engine crosses the operator's edges (status, pod, layout) and the fat fallback
runs on the fastest fat engine; eager plans keep their old forms and slot hashes."""

from __future__ import annotations

from packrat.controller.core.plans import from_status, layout, to_pod, to_status
from packrat.controller.profiling.verified import fat_plan
from packrat.controller.serving.slots import plan_hash
from packrat.plan.optimizer import InstanceGroup, Plan
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint


def _plan(engine: str) -> Plan:
    return Plan(
        cpus=2,
        batch=8,
        instances=(InstanceGroup(1, 4, 2, 70.0),),
        expected_latency_ms=70.0,
        fat_latency_ms=80.0,
        engine=engine,
    )


def test_the_engine_reaches_the_pod_and_the_status_and_back() -> None:
    plan = _plan("openvino")
    assert to_pod(plan)["engine"] == "openvino"
    status = to_status(plan)
    assert status["engine"] == "openvino" and status["label"] == "2x1t/b4 openvino"
    back = from_status(status)
    assert back is not None and back.engine == "openvino"


def test_an_engine_change_is_a_layout_change_and_eager_is_unchanged() -> None:
    eager, ov = _plan("eager"), _plan("openvino")
    assert layout(eager) != layout(ov)
    assert layout(ov) == layout(to_status(ov))
    assert layout(eager) == (2, 8, ((1, 4, 2),))  # the old form: slot hashes unchanged
    assert "engine" not in to_pod(eager) and "engine" not in to_status(eager)
    assert plan_hash(eager) != plan_hash(ov)


def test_the_fat_fallback_runs_on_the_fastest_fat_engine() -> None:
    profile = Profile(
        meta=ProfileMeta(model="m", cpus=2),
        points=(
            ProfilePoint(2, 8, 100.0),
            ProfilePoint(2, 8, 80.0, engine="openvino"),
            ProfilePoint(1, 4, 90.0),
        ),
    )
    fat = fat_plan(profile, cpus=2, batch=8)
    assert fat.engine == "openvino" and fat.label == "1x2t/b8 openvino"
    assert fat.expected_latency_ms == 80.0
