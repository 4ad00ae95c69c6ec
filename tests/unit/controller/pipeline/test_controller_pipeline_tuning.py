"""A pipeline's stages after the plan: the first Deployment of a stage is the planned one,
the per-hop overhead in the plan, and per-stage autoscaling (each stage model's own tuner
from the reference the pipeline planner simulated for it, or an external scaler)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kube_support import NS, T0
from pipeline_support import MODELS, NAME, STAGE_MODEL, Cluster, pipeline_body

from packrat.controller.core.model import PROFILE_ONLY_ANNOTATION, parse
from packrat.controller.core.spec import validate_spec
from packrat.controller.planning.autoscale import Arrivals
from packrat.plan.traces import gamma_trace

AUTO = {"minReplicas": 1, "maxReplicas": 6, "scaleDownDelaySeconds": 30}


def _notes(c: Cluster, model: str) -> dict[str, str]:
    return dict(c.obj("packratmodels", model)["metadata"].get("annotations") or {})


def _stage(c: Cluster, name: str) -> dict[str, Any]:
    return next(s for s in c.status()["stages"] if s["model"] == name)


def test_a_stage_deploys_only_its_planned_configuration(cluster: Cluster) -> None:
    """Before the plan a stage model profiles and deploys nothing; its first Deployment is
    the planned one, so no stage ever switches away from a placeholder."""
    c = cluster
    c.pipelines.reconcile(NS, NAME, now=T0)
    assert all(_notes(c, m) == {PROFILE_ONLY_ANNOTATION: "true"} for m in MODELS)
    waited = False
    for _ in range(12):
        c.step()
        for model in MODELS:
            deps = [d for d in c.kube.of("deployments") if d.startswith(f"{model}-")]
            if PROFILE_ONLY_ANNOTATION in _notes(c, model):
                assert not deps, f"{model} deployed before the plan"
                mstatus = c.obj("packratmodels", model).get("status") or {}
                waited |= mstatus.get("phase") == "Planning"
        if c.status().get("phase") == "Serving":
            break
    assert waited  # a stage model sat profiled, waiting for the pipeline's plan
    assert c.status()["phase"] == "Serving"
    for model in MODELS:
        stage = _stage(c, model)
        assert [d for d in c.kube.of("deployments") if d.startswith(f"{model}-")] == [f"{model}-a"]
        dep = c.obj("deployments", f"{model}-a")
        assert dep["spec"]["replicas"] == stage["replicas"]
        mstatus = c.obj("packratmodels", model)["status"]
        assert "switch" not in mstatus and mstatus["plan"]["label"] == stage["plan"]
        assert PROFILE_ONLY_ANNOTATION not in _notes(c, model)


def test_the_hop_overhead_is_planned_for() -> None:
    """Two stages in a chain: the end-to-end P99 carries (2 + 1) hops of hopOverheadMs."""
    slo = {"latencyP99Ms": 200, "rate": 20, "cv": 1.0, "durationSeconds": 30}
    none = Cluster(pipeline_body(slo={**slo, "hopOverheadMs": 0})).settle()
    hops = Cluster(pipeline_body(slo={**slo, "hopOverheadMs": 12})).settle()
    default = Cluster(pipeline_body(slo=slo)).settle()
    assert none["phase"] == hops["phase"] == default["phase"] == "Serving"
    assert none["planSignature"] != hops["planSignature"] != default["planSignature"]
    same = [(s["replicas"], s["cpusPerReplica"], s["batch"]) for s in none["stages"]]
    assert same == [(s["replicas"], s["cpusPerReplica"], s["batch"]) for s in hops["stages"]]
    assert hops["simulatedP99Ms"] == pytest.approx(none["simulatedP99Ms"] + 36.0, abs=0.01)
    assert default["simulatedP99Ms"] == pytest.approx(none["simulatedP99Ms"] + 30.0, abs=0.01)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (
            {"slo": {"latencyP99Ms": 100, "rate": 5, "hopOverheadMs": -1}},
            "spec.slo.hopOverheadMs",
        ),
        ({"autoscaling": {"mode": "sideways"}}, "spec.autoscaling.mode"),
        ({"autoscaling": {"reference": {"replicas": 1}}}, "the planner makes it"),
        (
            {"stages": [{"name": "a", "model": {**STAGE_MODEL, "autoscaling": {}}}], "edges": []},
            "spec.stages[0].model: the pipeline planner chooses",
        ),
    ],
)
def test_invalid_autoscaling_and_hops_name_the_field(changes: dict[str, Any], needle: str) -> None:
    c = Cluster(pipeline_body(**changes))
    assert c.pipelines.reconcile(NS, NAME, now=T0).phase == "Failed"
    assert needle in c.status()["message"]


def _burst(start: float, seconds: float, rate: float) -> list[float]:
    return (start + gamma_trace(rate, duration_s=seconds, seed=int(start))).tolist()


def test_envelope_autoscaling_scales_a_stage_from_its_own_arrivals() -> None:
    c = Cluster(pipeline_body(autoscaling=AUTO))
    status = c.settle()
    assert status["phase"] == "Serving"
    model = MODELS[1]
    stage = _stage(c, model)
    ref = stage["tunerReference"]
    assert ref["replicas"] == stage["replicas"] and ref["capacityPerReplica"] > 0
    assert len(ref["windowsSeconds"]) == len(ref["ratesPerSecond"]) >= 2
    spec = c.obj("packratmodels", model)["spec"]
    defaults = {"mode": "envelope", "intervalSeconds": 5, "startupFloorSeconds": 0}
    # a downstream stage's tuner reads the pipeline's ingress times its scale factor
    ingress = {"service": NAME, "scaleFactor": stage["scaleFactor"]}
    assert spec["autoscaling"] == {**defaults, **AUTO} | {"reference": ref, "ingress": ingress}
    assert "ingress" not in c.obj("packratmodels", MODELS[0])["spec"]["autoscaling"]  # a root
    parsed = parse(c.obj("packratmodels", model), default_image="img")  # a valid model
    assert parsed.spec["replicas"] == stage["replicas"]
    generation = c.obj("packratmodels", model)["metadata"]["generation"]

    # a burst far above what the stage was planned for reaches its pods: its own tuner
    # scales its active Deployment up in the same pass
    now = c.now + datetime.timedelta(seconds=6)
    burst = Arrivals(times=_burst(c.now.timestamp() + 1, 5, 8000), pods=1)
    res = c.models.reconcile(NS, model, now=now, arrivals=burst)
    assert ("Normal", "ScaledUp") in {(k, r) for k, r, _ in res.events}
    up = c.obj("deployments", f"{model}-a")["spec"]["replicas"]
    assert up > stage["replicas"]
    c.kube.make_ready(f"{model}-a")
    c.models.reconcile(NS, model, now=now, arrivals=None)

    # the pipeline mirrors the decision, posts it once, leaves the stage's spec alone and
    # still serves (the stage serves its tuner's count)
    result = c.pipelines.reconcile(NS, NAME, now=now)
    mirrored = _stage(c, model)["autoscaling"]
    assert mirrored["replicas"] == up and mirrored["lastScale"]["action"] == "scale_up"
    assert [r for _, r, _ in result.events] == ["StageScaled"]
    assert result.phase == "Serving"
    assert c.obj("packratmodels", model)["metadata"]["generation"] == generation
    again = c.pipelines.reconcile(NS, NAME, now=now)
    assert not again.events and again.phase == "Serving"


def test_external_autoscaling_leaves_a_serving_stage_to_its_scaler() -> None:
    c = Cluster(pipeline_body(autoscaling={"mode": "external"}))
    assert c.settle()["phase"] == "Serving"
    model = MODELS[0]
    planned = _stage(c, model)["replicas"]
    spec = c.obj("packratmodels", model)["spec"]
    assert spec["replicas"] == planned and spec["autoscaling"]["mode"] == "external"
    assert "reference" not in spec["autoscaling"]
    c.kube.patch("packratmodels", NS, model, {"spec": {"replicas": planned + 3}})  # an HPA
    for _ in range(3):
        c.step()
    assert c.obj("packratmodels", model)["spec"]["replicas"] == planned + 3
    assert c.obj("deployments", f"{model}-a")["spec"]["replicas"] == planned + 3
    assert _stage(c, model)["autoscaling"]["replicas"] == planned + 3
    assert c.status()["phase"] == "Serving"


REF = {"replicas": 2, "capacityPerReplica": 50.0, "windowsSeconds": [0.1, 0.2, 60.0]}


@pytest.mark.parametrize(
    ("auto", "extra", "needle"),
    [
        ({"reference": {**REF, "ratesPerSecond": [1.0, 2.0, 3.0]}}, {}, None),
        ({}, {}, "needs spec.slo or autoscaling.reference"),
        ({"reference": {**REF, "ratesPerSecond": [1.0]}}, {}, "needs one rate per window"),
        (
            {"reference": {**REF, "windowsSeconds": [1.0, 0.5], "ratesPerSecond": [1, 2]}},
            {},
            "windowsSeconds must increase",
        ),
        (
            {"mode": "external", "reference": {**REF, "ratesPerSecond": [1, 2, 3]}},
            {},
            "is for mode envelope",
        ),
        (
            {"reference": {**REF, "ratesPerSecond": [1, 2, 3]}},
            {"slo": {"latencyP99Ms": 100, "rate": 5}},
            "without slo",
        ),
    ],
)
def test_a_models_own_tuner_reference(
    auto: dict[str, Any], extra: dict[str, Any], needle: str | None
) -> None:
    spec: dict[str, Any] = {**STAGE_MODEL, "autoscaling": auto, **extra}
    if "slo" not in extra:
        spec["batchSize"] = 1
    errors = validate_spec(spec, name="m")
    if needle is None:
        assert errors == []
    else:
        assert any(needle in e for e in errors), errors


def test_the_operator_reads_arrivals_for_a_model_with_its_own_reference() -> None:
    """The daemon samples the pods' arrivals (every intervalSeconds) for a tuner from a
    reference as for one from an SLO; not for external mode, nor during a switch."""
    from packrat.controller.handlers import OperatorOptions, typed
    from packrat.controller.planning.schedule import before_pass

    def _tuner_interval(body: dict[str, Any]) -> float | None:
        body = {"metadata": {"name": "m"}, **body}
        return before_pass(typed(body, OperatorOptions()), body.get("status") or {}).tuning

    ref = {**REF, "ratesPerSecond": [1.0, 2.0, 3.0]}
    spec = {**STAGE_MODEL, "batchSize": 1, "autoscaling": {"intervalSeconds": 3, "reference": ref}}
    assert _tuner_interval({"spec": spec}) == 3.0
    assert _tuner_interval({"spec": {**spec, "autoscaling": {"mode": "external"}}}) is None
    assert _tuner_interval({"spec": {**spec, "autoscaling": {}}}) is None  # nothing to tune from
    assert _tuner_interval({"spec": spec, "status": {"switch": {"stage": "rollout"}}}) is None
