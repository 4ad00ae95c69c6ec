"""Issue 26, item 4: the pipeline planner runs in a child process with a time and a memory
budget, and its result (or its failure) is persisted: a 16-stage chain at the 200,000
arrivals the CRD admits is refused within the budget, with a condition and an event, while
the operator's own memory stays where it was; a restarted operator neither plans again what
it planned nor retries what was too expensive."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import yaml
from openapi_schema_validator import OAS30Validator
from packaging_support import ROOT, strict_schema
from pipeline_support import NAME, NS, STAGE_MODEL, Cluster, condition, pipeline_body

from packrat.controller.core.context import Config
from packrat.controller.pipeline.planning import plan_configmap_name
from packrat.controller.pipeline.reconcile import PipelineReconciler


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _restarted(c: Cluster) -> PipelineReconciler:
    """The operator after a restart: nothing in memory, the API's objects as they were."""
    return PipelineReconciler(c.kube, config=c.pipelines.config)


def test_a_16_stage_chain_at_the_admitted_maximum_stays_within_its_budget() -> None:
    names = [f"s{i}" for i in range(16)]
    body = pipeline_body(
        stages=[{"name": n, "model": copy.deepcopy(STAGE_MODEL)} for n in names],
        edges=[{"from": a, "to": b, "fraction": 1.0} for a, b in itertools.pairwise(names)],
        slo={"latencyP99Ms": 200, "rate": 2000, "cv": 1.0, "durationSeconds": 100},
    )
    c = Cluster(body)
    budget = Config(image="img", pipeline_plan_seconds=3.0, pipeline_plan_memory_mib=512)
    c.pipelines = PipelineReconciler(c.kube, config=budget)
    before = _rss_mib()
    for _ in range(6):
        c.step()
        if condition(c.status(), "Provisioned").get("reason") == "PlanningBudgetExceeded":
            break
    status = c.status()
    cond = condition(status, "Provisioned")
    assert cond["status"] == "False" and cond["reason"] == "PlanningBudgetExceeded", status
    assert status["phase"] == "Failed" and status["planning"]["reason"] == cond["reason"]
    crd = yaml.safe_load((ROOT / "crds" / "packratpipeline.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    OAS30Validator(strict_schema(schema)).validate(status)  # the API server keeps it
    assert _rss_mib() - before < 100  # the planning's memory was the child's, not ours
    assert c.pipelines.plans.misses == 1
    # a restarted operator does not plan the same inputs again
    again = _restarted(c)
    result = again.reconcile(NS, NAME, now=c.now)
    assert again.plans.misses == 0 and result.phase == "Failed"
    assert condition(c.status(), "Provisioned")["reason"] == "PlanningBudgetExceeded"


def test_a_plan_is_persisted_and_a_restart_does_not_replan(cluster: Cluster) -> None:
    c = cluster
    status = c.settle()
    assert status["phase"] == "Serving", status
    cm = c.obj("configmaps", plan_configmap_name(NAME))
    (ref,) = cm["metadata"]["ownerReferences"]
    assert ref["kind"] == "PackratPipeline" and cm["data"]["signature"] == status["planSignature"]
    again = _restarted(c)
    result = again.reconcile(NS, NAME, now=c.now)
    assert again.plans.misses == 0 and result.phase == "Serving"
    assert c.status()["stages"] == status["stages"]
    # a plan ConfigMap edited by hand is not trusted: planned again and written back
    c.kube.patch("configmaps", NS, plan_configmap_name(NAME), {"data": {"plan.json": "{}"}})
    third = _restarted(c)
    third.reconcile(NS, NAME, now=c.now)
    assert third.plans.misses == 1
    fixed: dict[str, Any] = c.obj("configmaps", plan_configmap_name(NAME))
    assert fixed["data"]["plan.json"] != "{}"


def test_planning_children_are_bounded_in_number() -> None:
    """Issue 38: planning children are bounded one by one and in number (3 at once took 632 MB
    beside the operator): a pipeline finding every child slot taken waits its turn, neither
    failed nor planned, and is planned once a slot is free."""
    from packrat.controller.pipeline import plan_job

    taken = 0
    while plan_job.CHILDREN.acquire(blocking=False):  # other pipelines are being planned
        taken += 1
    assert taken == plan_job.MAX_CHILDREN
    try:
        c = Cluster()
        for _ in range(8):
            c.step()
        status = c.status()
        cond = condition(status, "Provisioned")
        assert cond["reason"] == "PlanningQueued" and status.get("phase") != "Failed", status
        assert "planning" not in status  # not a failure remembered for these inputs
    finally:
        for _ in range(taken):
            plan_job.CHILDREN.release()
    assert c.settle()["phase"] == "Serving"
