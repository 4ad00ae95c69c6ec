"""The PackratPipeline reconcile pass against the in-memory API, with the PackratModel
reconciler playing the stage models: create, profile, plan, serve, drift, conflicts, errors."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
import yaml
from kube_support import NS, T0, FakeKube, profile_json
from openapi_schema_validator import OAS30Validator
from packaging_support import ROOT, strict_schema
from pipeline_support import MODELS, NAME, STAGE_MODEL, Cluster, condition, pipeline_body

from packrat.controller.api.kube import KubeError
from packrat.controller.core.context import Config
from packrat.controller.core.model import SERVING_CPUS_ANNOTATION, parse
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.profiling.manifests import profile_configmap


def test_first_pass_creates_owned_stage_models_and_router(cluster: Cluster) -> None:
    c = cluster
    result = c.pipelines.reconcile(NS, NAME, now=T0)
    assert result.phase == "Pending"
    assert c.kube.of("packratmodels") == list(MODELS)
    for name in MODELS:
        model = c.obj("packratmodels", name)
        (ref,) = model["metadata"]["ownerReferences"]
        assert ref["kind"] == "PackratPipeline" and ref["uid"] == "p1" and ref["controller"]
        # before every stage is profiled: batch 1, nothing served, no size chosen
        assert model["spec"]["batchSize"] == 1 and model["spec"]["replicas"] == 0
        assert SERVING_CPUS_ANNOTATION not in (model["metadata"].get("annotations") or {})
        assert model["metadata"]["labels"]["packrat.dev/pipeline"] == NAME
    for resource, name in (
        ("configmaps", "chain-router"),
        ("deployments", "chain-router"),
        ("services", "chain"),
    ):
        (ref,) = c.obj(resource, name)["metadata"]["ownerReferences"]
        assert ref["kind"] == "PackratPipeline" and ref["uid"] == "p1"
    status = c.status()
    assert status["phase"] == "Pending" and status["observedGeneration"] == 1
    assert condition(status, "Ready")["reason"] == "Profiling"
    assert [s["name"] for s in status["stages"]] == ["first", "second"]
    assert ("Normal", "StageCreated", "stage first: PackratModel chain-first") in result.events


def test_profiles_then_plan_then_serving(cluster: Cluster) -> None:
    c = cluster
    status = c.settle()
    assert status["phase"] == "Serving", status
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Provisioned")["reason"] == "Feasible"
    assert status["simulatedP99Ms"] <= 200 and status["sloMet"] is True
    assert status["cores"] == sum(s["cores"] for s in status["stages"])
    assert set(status["baselines"]) == {"mean", "peak"}
    for stage, name in zip(status["stages"], MODELS, strict=True):
        model = c.obj("packratmodels", name)
        assert stage["model"] == name and stage["phase"] == "Ready"
        assert model["spec"]["batchSize"] == stage["batch"]
        assert model["spec"]["replicas"] == stage["replicas"] >= 1
        cpus = model["metadata"]["annotations"][SERVING_CPUS_ANNOTATION]
        assert int(cpus) == stage["cpusPerReplica"]
        # the stage model serves the planned size, profiled once on spec.cpus
        mstatus = model["status"]
        assert mstatus["servingSpec"]["cpus"] == stage["cpusPerReplica"]
        assert mstatus["plan"]["label"] == stage["plan"]
        assert model["spec"]["cpus"] == 2
    assert status["router"] == {"replicas": 2, "readyReplicas": 2}
    assert status["endpoint"] == {"service": f"{NAME}.{NS}.svc", "port": 8080}


def test_stage_plan_is_what_the_stage_model_serves() -> None:
    """One thread's batch 2 measured a hair faster than its batch 1 (the ``tiny`` model's
    latency is flat within noise; on a loaded machine either can come out ahead): the
    pipeline planner plans batch 1 as 1x1t/b1, the stage model serves batch 1 on the faster
    1x1t/b2 (a monotone plan, plan/padding.py). The stage's status says what it serves."""
    c = Cluster(profile=profile_json({(1, 2): 0.95}))
    status = c.settle()
    assert status["phase"] == "Serving", status
    for stage, name in zip(status["stages"], MODELS, strict=True):
        served = c.obj("packratmodels", name)["status"]["plan"]
        assert (stage["batch"], stage["cpusPerReplica"]) == (1, 1), stage
        assert (served["batch"], served["capacity"]) == (1, 2), served  # padded
        assert stage["plan"] == served["label"] == "1x1t/b2"
    assert c.pipelines.reconcile(NS, NAME, now=c.now).events == []  # and stays so, at rest
    assert [s["plan"] for s in c.status()["stages"]] == ["1x1t/b2", "1x1t/b2"]


def test_a_pass_at_rest_writes_nothing(cluster: Cluster) -> None:
    c = cluster
    assert c.settle()["phase"] == "Serving"
    before = copy.deepcopy(c.kube.objects)
    creates = len(c.kube.creates)
    result = c.pipelines.reconcile(NS, NAME, now=c.now)
    assert result.phase == "Serving" and not result.waiting and not result.events
    assert c.kube.objects == before and len(c.kube.creates) == creates


def test_status_matches_the_crd_schema(cluster: Cluster) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "packratpipeline.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    validator = OAS30Validator(strict_schema(schema))
    c = cluster
    c.pipelines.reconcile(NS, NAME, now=T0)
    validator.validate(c.status())  # profiling
    validator.validate(c.settle())  # serving
    c.kube.patch("packratpipelines", NS, NAME, {"spec": {"stages": [{"name": "x"}]}})
    c.pipelines.reconcile(NS, NAME, now=T0)
    validator.validate(c.status())  # invalid


def test_drifted_children_are_put_back(cluster: Cluster) -> None:
    c = cluster
    assert c.settle()["phase"] == "Serving"
    c.kube.patch("packratmodels", NS, "chain-first", {"spec": {"batchSize": 4, "memory": "1Gi"}})
    c.kube.patch(
        "packratmodels",
        NS,
        "chain-first",
        {"metadata": {"annotations": {SERVING_CPUS_ANNOTATION: None}}},
    )
    c.kube.patch("configmaps", NS, "chain-router", {"data": {"router.yaml": "{}"}})
    c.kube.patch("services", NS, "chain", {"spec": {"selector": {"app": "other"}}})
    c.kube.delete("deployments", NS, "chain-router")
    c.pipelines.reconcile(NS, NAME, now=c.now)
    status = c.status()
    first = c.obj("packratmodels", "chain-first")
    assert first["spec"]["batchSize"] == status["stages"][0]["batch"]
    assert first["spec"]["memory"] == "4Gi"  # the stage's spec (the default), not the edit
    assert SERVING_CPUS_ANNOTATION in first["metadata"]["annotations"]
    assert "stages" in yaml.safe_load(c.obj("configmaps", "chain-router")["data"]["router.yaml"])
    assert "app" not in c.obj("services", "chain")["spec"]["selector"]
    assert c.kube.get("deployments", NS, "chain-router") is not None
    assert status["phase"] == "Provisioning"  # the router has no ready pod yet
    assert c.settle()["phase"] == "Serving"


def test_the_routers_token_secret_is_the_pipelines_and_never_adopted(cluster: Cluster) -> None:
    """Issue 38: the pass makes the routers' token Secret, owned by the pipeline; one under
    its name that is not the pipeline's is a conflict, and no router mounts it."""
    c = cluster
    c.pipelines.reconcile(NS, NAME, now=T0)
    secret = c.obj("secrets", f"{NAME}-router-token")
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "PackratPipeline"
    c.kube.delete("secrets", NS, f"{NAME}-router-token")
    c.kube.delete("deployments", NS, f"{NAME}-router")
    c.kube.create("secrets", NS, {"metadata": {"name": f"{NAME}-router-token"}, "data": {}})
    c.pipelines.reconcile(NS, NAME, now=T0)
    assert c.kube.get("deployments", NS, f"{NAME}-router") is None
    conflict = condition(c.status(), "OwnershipConflict")
    assert conflict["status"] == "True" and f"Secret {NAME}-router-token" in conflict["message"]


def test_foreign_objects_are_a_conflict_never_touched(cluster: Cluster) -> None:
    c = cluster
    foreign = {"metadata": {"name": "chain", "namespace": NS}, "spec": {"selector": {"a": "b"}}}
    c.kube.create("services", NS, foreign)
    mine = {"metadata": {"name": "chain-second", "namespace": NS}, "spec": {"cpus": 1}}
    c.kube.create("packratmodels", NS, mine)
    result = c.pipelines.reconcile(NS, NAME, now=T0)
    assert result.phase == "Failed" and result.waiting
    assert c.obj("services", "chain")["spec"] == foreign["spec"]
    assert c.obj("packratmodels", "chain-second")["spec"] == mine["spec"]
    assert c.kube.of("packratmodels") == ["chain-second"]  # nothing created either
    status = c.status()
    conflict = condition(status, "OwnershipConflict")
    assert conflict["status"] == "True"
    assert "PackratModel chain-second" in conflict["message"]
    assert "Service chain" in conflict["message"]
    assert condition(status, "Ready")["reason"] == "OwnershipConflict"
    warnings = [e for e in result.events if e[1] == "OwnershipConflict"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning"
    # the same conflict again: no second event; once the objects go, the pipeline proceeds
    assert not c.pipelines.reconcile(NS, NAME, now=T0).events
    c.kube.delete("services", NS, "chain")
    c.kube.delete("packratmodels", NS, "chain-second")
    result = c.pipelines.reconcile(NS, NAME, now=T0)
    assert result.phase == "Pending"
    assert condition(c.status(), "OwnershipConflict")["status"] == "False"


def test_invalid_spec_creates_nothing() -> None:
    model = {**STAGE_MODEL, "batchSize": 4}
    c = Cluster(pipeline_body(stages=[{"name": "first", "model": model}], edges=[]))
    result = c.pipelines.reconcile(NS, NAME, now=T0)
    assert result.phase == "Failed" and result.result == "invalid"
    assert c.kube.creates == [("packratpipelines", NAME)]
    status = c.status()
    assert (
        "batchSize" in status["message"] and condition(status, "Ready")["reason"] == "InvalidSpec"
    )
    assert [e[1] for e in result.events] == ["InvalidSpec"]


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"edges": [{"from": "first", "to": "nope"}]}, "unknown stage 'nope'"),
        (
            {"edges": [{"from": "first", "to": "second"}, {"from": "second", "to": "first"}]},
            "cycle",
        ),
        ({"slo": {"latencyP99Ms": 100}}, "exactly one of slo.trace and slo.rate"),
        ({"stages": [{"name": "router", "model": STAGE_MODEL}], "edges": []}, "router"),
        ({"stages": [{"name": "a", "model": {"cpus": 2}}], "edges": []}, "spec.model is required"),
        (
            {"edges": [{"from": "first", "to": "second", "when": {"json": "x", "below": "y"}}]},
            "spec.edges[0].when.below must be a number",
        ),
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, Any], needle: str) -> None:
    c = Cluster(pipeline_body(**changes))
    assert c.pipelines.reconcile(NS, NAME, now=T0).phase == "Failed"
    assert needle in c.status()["message"]


def test_api_error_leaves_status_unchanged(cluster: Cluster) -> None:
    c = cluster
    c.pipelines.reconcile(NS, NAME, now=T0)
    before = c.status()

    def fail(*_: Any, **__: Any) -> bool:
        raise KubeError(500, "boom")

    c.kube.delete("deployments", NS, "chain-router")
    c.kube.create = fail  # type: ignore[method-assign]
    with pytest.raises(KubeError):
        c.pipelines.reconcile(NS, NAME, now=T0 + datetime.timedelta(seconds=60))
    assert c.status() == before


def test_removed_stage_model_is_deleted_and_router_reconfigured(cluster: Cluster) -> None:
    c = cluster
    assert c.settle()["phase"] == "Serving"
    c.kube.patch(
        "packratpipelines",
        NS,
        NAME,
        {"spec": {"stages": [{"name": "first", "model": STAGE_MODEL}], "edges": []}},
    )
    result = c.pipelines.reconcile(NS, NAME, now=c.now)
    assert ("Normal", "StageRemoved") in [(k, r) for k, r, _ in result.events]
    assert c.kube.of("packratmodels") == ["chain-first"]
    config = yaml.safe_load(c.obj("configmaps", "chain-router")["data"]["router.yaml"])
    assert list(config["stages"]) == ["first"]
    status = c.settle()
    assert status["phase"] == "Serving" and status["observedGeneration"] == 2
    assert [s["name"] for s in status["stages"]] == ["first"]


def test_unreadable_trace_keeps_the_last_plan() -> None:
    trace = {"configMap": "arrivals", "key": "trace.txt"}
    c = Cluster(pipeline_body(slo={"latencyP99Ms": 200, "trace": trace}))
    times = "\n".join(f"{i * 0.05:.3f}" for i in range(600))
    c.kube.create(
        "configmaps", NS, {"metadata": {"name": "arrivals"}, "data": {"trace.txt": times}}
    )
    status = c.settle()
    assert status["phase"] == "Serving"
    planned = [(s["replicas"], s["cpusPerReplica"], s["batch"]) for s in status["stages"]]
    c.kube.delete("configmaps", NS, "arrivals")
    c.pipelines.plans = type(c.pipelines.plans)()  # as after an operator restart
    result = c.pipelines.reconcile(NS, NAME, now=c.now)
    status = c.status()
    assert result.phase == "Serving"  # the last plan keeps serving
    assert condition(status, "Provisioned")["reason"] == "TraceUnavailable"
    assert [(s["replicas"], s["cpusPerReplica"], s["batch"]) for s in status["stages"]] == planned
    assert [k for k, r, _ in result.events if r == "TraceUnavailable"] == ["Warning"]
    assert not c.pipelines.reconcile(NS, NAME, now=c.now).events  # reported once


def test_deleted_pipeline_is_gone(cluster: Cluster) -> None:
    c = cluster
    c.kube.delete("packratpipelines", NS, NAME)
    assert c.pipelines.reconcile(NS, NAME, now=T0).result == "gone"


def test_model_serving_cpus_annotation(kube: FakeKube) -> None:
    body = {
        "metadata": {
            "name": "m",
            "namespace": NS,
            "annotations": {SERVING_CPUS_ANNOTATION: "1"},
        },
        "spec": {**STAGE_MODEL, "batchSize": 2},
    }
    kube.create("packratmodels", NS, body)
    rec = Reconciler(kube, config=Config(image="img"))
    rec.reconcile(NS, "m", now=T0)
    obj = kube.get("packratmodels", NS, "m")
    assert obj is not None
    assert parse(obj, default_image="img").profile_key == obj["status"]["profile"]["key"]
    kube.create(
        "configmaps",
        NS,
        profile_configmap(parse(obj, default_image="img"), profile_json=profile_json()),
    )
    rec.reconcile(NS, "m", now=T0)
    obj = kube.get("packratmodels", NS, "m")
    assert obj is not None
    assert obj["status"]["servingSpec"]["cpus"] == 1 and obj["status"]["plan"]["cpus"] == 1
    dep = kube.get("deployments", NS, "m-a")
    assert dep is not None
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["cpu"] == "1"
    kube.patch(
        "packratmodels", NS, "m", {"metadata": {"annotations": {SERVING_CPUS_ANNOTATION: "3"}}}
    )
    assert rec.reconcile(NS, "m", now=T0).result == "invalid"


def test_smaller_stage_cpus_never_makes_the_stage_model_invalid(cluster: Cluster) -> None:
    c = cluster
    assert c.settle()["phase"] == "Serving"
    first = {**STAGE_MODEL, "cpus": 1, "profiling": {"maxBatch": 2}}
    c.kube.patch(
        "packratpipelines",
        NS,
        NAME,
        {
            "spec": {
                "stages": [{"name": "first", "model": first}, pipeline_body()["spec"]["stages"][1]]
            }
        },
    )
    c.pipelines.reconcile(NS, NAME, now=c.now)  # the last plan, within the new limits
    model = c.obj("packratmodels", "chain-first")
    assert int(model["metadata"]["annotations"][SERVING_CPUS_ANNOTATION]) <= 1
    assert model["spec"]["batchSize"] <= 2
    assert c.models.reconcile(NS, "chain-first", now=c.now).result != "invalid"
    status = c.settle()
    assert status["phase"] == "Serving" and status["observedGeneration"] == 2
    assert status["stages"][0]["cpusPerReplica"] == 1
