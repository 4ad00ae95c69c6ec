"""spec.slo and spec.autoscaling in the operator: validation, provisioning in a pass (replicas,
CPUs per replica and batch from the planner, status and conditions), infeasible SLOs, the
tuner scaling the active Deployment, and mode external leaving replicas to spec.replicas."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kube_support import (
    NS,
    T0,
    FakeKube,
    add_model,
    gamma_burst,
    profile_json,
    to_ready,
    unbatched_spec,
)

from packrat.controller.core.spec import validate_spec
from packrat.controller.core.status import get_condition
from packrat.controller.model.reconcile import Config, Reconciler
from packrat.controller.planning.autoscale import Arrivals
from packrat.plan.profile import parse_profile
from packrat.plan.provision import Planner, SimSettings, exhaustive
from packrat.plan.traces import gamma_trace


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (unbatched_spec(slo={"latencyP99Ms": 50}), "exactly one of slo.trace and slo.rate"),
        (
            unbatched_spec(
                slo={"latencyP99Ms": 50, "rate": 10, "trace": {"configMap": "t", "key": "k"}}
            ),
            "exactly one of slo.trace and slo.rate",
        ),
        (unbatched_spec(slo={"latencyP99Ms": 0, "rate": 10}), "latencyP99Ms"),
        (unbatched_spec(slo={"latencyP99Ms": 50, "rate": 10}, batchSize=4), "do not set batchSize"),
        (
            unbatched_spec(slo={"latencyP99Ms": 50, "rate": 10, "bogus": 1}),
            "spec.slo.bogus: unknown",
        ),
        (unbatched_spec(slo={"latencyP99Ms": 50, "rate": 1000, "durationSeconds": 3600}), "200000"),
        (unbatched_spec(batchSize=4, autoscaling={}), "envelope needs spec.slo"),
        (
            unbatched_spec(
                slo={"latencyP99Ms": 50, "rate": 10},
                autoscaling={"minReplicas": 3, "maxReplicas": 2},
            ),
            "minReplicas must not exceed",
        ),
        (
            unbatched_spec(slo={"latencyP99Ms": 50, "rate": 10}, autoscaling={"mode": "hpa"}),
            "mode must",
        ),
        *(
            (
                unbatched_spec(
                    slo={"latencyP99Ms": 50, "rate": 10}, autoscaling={"ingress": ingress}
                ),
                message,
            )
            for ingress, message in (
                ({"service": "Bad_Name", "scaleFactor": 0.5}, "ingress.service must be"),
                ({"service": "pipe\n", "scaleFactor": 0.5}, "ingress.service must be"),
                ({"service": "pipe", "scaleFactor": 0}, "ingress.scaleFactor must be"),
                ({"service": "pipe", "scaleFactor": 1.5}, "ingress.scaleFactor must be"),
                ({"service": "pipe", "scaleFactor": float("nan")}, "ingress.scaleFactor"),
                ({"service": "pipe", "scaleFactor": 0.5, "x": 1}, "ingress.x: unknown"),
                ("pipe", "ingress must be an object"),
            )
        ),
    ],
)
def test_bad_slo_specs_are_refused(spec: dict[str, Any], message: str) -> None:
    errors = validate_spec(spec, name="tiny")
    assert any(message in e for e in errors), errors


def test_good_slo_specs_pass() -> None:
    assert validate_spec(unbatched_spec(slo={"latencyP99Ms": 50, "rate": 10}), name="tiny") == []
    trace = {"latencyP99Ms": 50, "trace": {"configMap": "t", "key": "k"}}
    assert (
        validate_spec(unbatched_spec(slo=trace, autoscaling={"maxReplicas": 4}), name="tiny") == []
    )
    external = unbatched_spec(batchSize=4, autoscaling={"mode": "external"})
    assert validate_spec(external, name="tiny") == []
    ingress = {"ingress": {"service": "pipe", "scaleFactor": 0.25}}
    assert validate_spec(unbatched_spec(slo=trace, autoscaling=ingress), name="tiny") == []


SLO = {"latencyP99Ms": 20, "rate": 2000, "durationSeconds": 4, "maxCores": 12}


def test_slo_provisions_replicas_size_and_batch_at_the_exhaustive_optimum(kube: FakeKube) -> None:
    rec = add_model(kube, unbatched_spec(slo=SLO))
    res = to_ready(kube, rec)
    assert res.phase == "Ready"
    status = kube.prm()["status"]
    prov = status["provisioning"]
    cond = get_condition(status["conditions"], "Provisioned")
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "Feasible"
    assert prov["feasible"] and prov["simulatedP99Ms"] <= 20
    assert prov["cores"] == prov["replicas"] * prov["cpusPerReplica"]
    # the Deployment runs what was provisioned: replicas, CPUs per replica, the plan's batch
    dep = kube.get("deployments", NS, "tiny-a")
    assert dep is not None and dep["spec"]["replicas"] == prov["replicas"]
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["cpu"]) == prov["cpusPerReplica"]
    assert status["plan"]["batch"] == prov["batch"] and status["plan"]["cpus"] == int(limits["cpu"])
    # the same trace and search, exhaustively: the operator's answer is the cheapest
    profile = parse_profile(profile_json(), origin="test")
    trace = gamma_trace(2000, cv=1.0, duration_s=4, seed=12)
    best = exhaustive(
        Planner(
            profile.table(), trace, slo_ms=20, max_cores=12, sim=SimSettings(max_batch_delay_ms=5)
        )
    )
    assert best is not None and prov["cores"] == best.config.cores
    assert set(prov["baselines"]) == {"mean", "peak"}


def test_infeasible_slo_serves_the_lowest_p99_with_a_condition_and_event(kube: FakeKube) -> None:
    rec = add_model(
        kube, unbatched_spec(slo={"latencyP99Ms": 0.5, "rate": 100, "durationSeconds": 4})
    )
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=profile_json())
    res = rec.reconcile(NS, "tiny", now=T0)
    status = kube.prm()["status"]
    cond = get_condition(status["conditions"], "Provisioned")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "Infeasible"
    assert ("Warning", "SloInfeasible") in {(k, r) for k, r, _ in res.events}
    assert status["provisioning"]["feasible"] is False
    assert kube.of("deployments") == ["tiny-a"]  # still serves the best it can


def _ready_with_a_trace(kube: FakeKube) -> Reconciler:
    """``tiny`` Ready with an SLO whose trace is the ConfigMap ``trace`` (key ``t.csv``)."""
    cm = {"metadata": {"name": "trace", "namespace": NS}, "data": {"t.csv": "0\n0.001\n0.002\n"}}
    kube.create("configmaps", NS, cm)
    ref = {"latencyP99Ms": 20, "trace": {"configMap": "trace", "key": "t.csv"}}
    rec = add_model(kube, unbatched_spec(slo=ref))
    assert to_ready(kube, rec).phase == "Ready"
    return rec


def test_missing_trace_configmap_is_a_condition_and_keeps_serving(kube: FakeKube) -> None:
    rec = _ready_with_a_trace(kube)
    kube.delete("configmaps", NS, "trace")
    kube.patch("packratmodels", NS, "tiny", {"spec": {"slo": {"latencyP99Ms": 19}}})
    res = rec.reconcile(NS, "tiny", now=T0)
    status = kube.prm()["status"]
    cond = get_condition(status["conditions"], "Provisioned")
    assert cond is not None and cond["reason"] == "TraceUnavailable"
    assert "not found" in cond["message"]
    assert ("Warning", "TraceUnavailable") in {(k, r) for k, r, _ in res.events}
    dep = kube.get("deployments", NS, "tiny-a")
    assert dep is not None and dep["spec"]["replicas"] >= 1  # last good keeps serving


def test_a_trace_spanning_1e308_seconds_is_a_condition_and_keeps_serving(kube: FakeKube) -> None:
    """Issue 38's sibling in the operator: a trace ConfigMap with a 1e308 timestamp."""
    rec = _ready_with_a_trace(kube)
    kube.patch("configmaps", NS, "trace", {"data": {"t.csv": "0\n0.001\n1e308\n"}})
    kube.patch("packratmodels", NS, "tiny", {"spec": {"slo": {"latencyP99Ms": 19}}})
    rec.reconcile(NS, "tiny", now=T0)
    cond = get_condition(kube.prm()["status"]["conditions"], "Provisioned")
    assert cond is not None and cond["reason"] == "TraceUnavailable"
    assert "at most 31536000 s" in cond["message"]
    dep = kube.get("deployments", NS, "tiny-a")
    assert dep is not None and dep["spec"]["replicas"] >= 1  # last good keeps serving


def test_tuner_scales_the_active_deployment_up_at_once_and_down_after_the_delay(
    kube: FakeKube,
) -> None:
    auto = {"minReplicas": 1, "maxReplicas": 8, "scaleDownDelaySeconds": 30}
    rec = add_model(kube, unbatched_spec(slo=SLO, autoscaling=auto))
    to_ready(kube, rec)
    planned = kube.prm()["status"]["provisioning"]["replicas"]
    t0 = T0.timestamp()
    # no reading yet (no pod answered): nothing changes
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1), arrivals=None)
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == planned  # type: ignore[index]
    # four times the planned rate for 5 s: more replicas in the same pass
    burst = Arrivals(times=gamma_burst(t0 + 1, 5, 8000), pods=1)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=6), arrivals=burst)
    up = kube.get("deployments", NS, "tiny-a")["spec"]["replicas"]  # type: ignore[index]
    assert up > planned
    status = kube.prm()["status"]
    assert status["autoscaling"]["replicas"] == up
    assert status["autoscaling"]["lastDecision"]["action"] == "scale_up"
    assert ("Normal", "ScaledUp") in {(k, r) for k, r, _ in res.events}
    assert res.autoscale is not None and res.autoscale["action"] == "scale_up"
    assert status["replicas"] == up and "packrat.dev/slot=a" in status["selector"]
    # a restarted operator serves the tuner's count, not the planned one
    rec2 = Reconciler(kube, config=Config(image="img"))
    rec2.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=7), arrivals=None)
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == up  # type: ignore[index]
    # back at the planned rate: held while the delay runs, down once it has passed
    now = 7.0
    for second in range(8, 130, 5):
        quiet = Arrivals(times=gamma_burst(t0 + now, second - now, 1000), pods=1)
        now = float(second)
        rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=second), arrivals=quiet)
        n = kube.get("deployments", NS, "tiny-a")["spec"]["replicas"]  # type: ignore[index]
        if second < 6 + 30:
            assert n == up, second
    assert n < up


def test_external_mode_follows_spec_replicas_and_never_writes_them(kube: FakeKube) -> None:
    rec = add_model(kube, unbatched_spec(slo=SLO, autoscaling={"mode": "external"}, replicas=2))
    to_ready(kube, rec)
    kube.patch("packratmodels", NS, "tiny", {"spec": {"replicas": 5}})  # the HPA scales
    many = Arrivals(times=gamma_burst(T0.timestamp(), 5, 8000), pods=1)
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=5), arrivals=many)
    assert kube.get("deployments", NS, "tiny-a")["spec"]["replicas"] == 5  # type: ignore[index]
    obj = kube.prm()
    assert obj["spec"]["replicas"] == 5
    assert "autoscaling" not in obj["status"] and obj["status"]["replicas"] == 5
