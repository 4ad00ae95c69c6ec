"""A PackratPipeline end to end: the real operator creates its stage models, plans them, runs
the router, serves queries through the pipeline's Service (and reads their P99 over the
trailing window back from the router pods), each stage's tuner reads its pods' arrivals, and
a delete cascades. A stage model deploys only its planned configuration (no switch away from
a placeholder).

The operator (kopf subprocess) runs against the kmock emulator; the test agent runs the real
``packrat serve`` pods of both stage models and the real ``packrat route`` pods of the router
(its config's Service URLs resolved to the agent's kube-proxy, as cluster DNS would). The
pipeline is two stages of the ``tiny`` zoo model side by side (both roots: every query visits
both and the router joins their answers); a chain of ``tiny`` into ``tiny`` cannot serve, since
its output (4 numbers) is not its input (16). The test is not about profiling: each stage model
gets the session's measured profile (``tiny_profiles``) as its profile ConfigMap as soon as
the operator keys it. No timing assertions; every wait polls a condition with a deadline sized
for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from harness import OperatorCluster, wait_for
from jsonhttp import http_json
from models import FIRST_READY_S, tiny_spec
from seeding import MeasuredProfiles, seed_profile

from packrat.controller.pipeline.latency import MIN_QUERIES
from packrat.controller.serving.admin_token import secret_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

NAME = "duo"
STAGES = ("left", "right")
STAGE_MODEL: dict[str, Any] = tiny_spec(8)
# each stage's own tuner scales it from the arrivals its pods see; the scale-down delay is
# longer than the test, so a stage scaled up by the test's queries stays up while checked
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2, "scaleDownDelaySeconds": 3600}
SLOW = 240.0  # a deadline for anything that takes seconds on a quiet machine


def _pipeline() -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": NAME},
        "spec": {
            "stages": [{"name": s, "model": STAGE_MODEL} for s in STAGES],
            "slo": {"latencyP99Ms": 1000, "rate": 5, "durationSeconds": 60},
            "autoscaling": {**AUTOSCALING, "intervalSeconds": 2},
        },
    }


def _status(cluster: OperatorCluster) -> dict[str, Any]:
    obj = cluster.api.get("packratpipelines", NAME)
    assert obj is not None, "the pipeline is gone"
    return dict(obj.get("status") or {})


def _ready(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _query(cluster: OperatorCluster) -> tuple[int, Any, str]:
    request = urllib.request.Request(
        f"{cluster.agent.proxy.url(NAME)}/predictions/{NAME}",
        data=json.dumps([0.1] * 16).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            path = resp.headers.get("X-Packrat-Path", "")
            return resp.status, json.loads(resp.read()), path
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), ""
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc), ""


def test_pipeline_lifecycle(cluster: OperatorCluster, tiny_profiles: MeasuredProfiles) -> None:
    profile = tiny_profiles.profile(STAGE_MODEL["profiling"]["maxBatch"])
    created = cluster.api.create("packratpipelines", _pipeline())
    uid = created["metadata"]["uid"]
    models = [f"{NAME}-{s}" for s in STAGES]

    # the operator creates one PackratModel per stage, owned by the pipeline
    for model in models:
        wait_for(
            lambda m=model: cluster.api.get("packratmodels", m),
            timeout=SLOW,
            what=f"stage model {model}",
            detail=lambda: f"pipeline status: {_status(cluster)}\n{cluster.log_tail(20)}",
        )
        refs = cluster.model(model)["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [
            ("PackratPipeline", uid, True)
        ]
        seed_profile(cluster, model, profile)

    # profiles -> plan -> stage models switch to it -> router ready: Ready
    status = wait_for(
        lambda: (s := _status(cluster)) and _ready(s) and s,
        timeout=FIRST_READY_S,
        what=f"{NAME} Ready",
        period=0.5,
        detail=lambda: f"status: {_status(cluster)}\nlog:\n{cluster.log_tail(20)}",
    )
    assert status["phase"] == "Serving" and status["observedGeneration"] == 1
    assert status["sloMet"] is True and status["simulatedP99Ms"] <= 1000
    assert [s["name"] for s in status["stages"]] == list(STAGES)
    for stage, model in zip(status["stages"], models, strict=True):
        assert stage["model"] == model and stage["phase"] == "Ready"
        assert stage["replicas"] >= 1 and 1 <= stage["cpusPerReplica"] <= 2
        mstatus = cluster.status(model)
        assert mstatus["servingSpec"]["cpus"] == stage["cpusPerReplica"]
        assert mstatus["plan"]["label"] == stage["plan"]  # what it serves (maybe padded)
        assert mstatus["profile"]["configMap"]  # planned from the seeded profile
        # its first Deployment was the planned one: it never switched (no slot b)
        assert not mstatus.get("switchHistory") and not mstatus.get("switch")
        assert cluster.api.get("deployments", f"{model}-b") is None
        # its own tuner, from the reference the pipeline planner simulated for it
        auto = cluster.model(model)["spec"]["autoscaling"]
        assert auto["mode"] == "envelope" and auto["reference"] == stage["tunerReference"]
    assert status["router"]["readyReplicas"] == 2

    # a query through the pipeline's Service visits both stages and is answered 200
    _, answer, path = wait_for(
        lambda: (r := _query(cluster))[0] == 200 and r,
        timeout=SLOW,
        what="a 200 through the pipeline's Service",
        period=1.0,
        detail=lambda: f"last answer: {_query(cluster)}",
    )
    assert set(answer) == set(STAGES), answer
    assert all(isinstance(v, list) and len(v) == 4 for v in answer.values()), answer
    assert sorted(path.split(",")) == sorted(STAGES), path
    for _ in range(MIN_QUERIES):  # enough answers for the router's measured P99
        assert _query(cluster)[0] == 200
    # issue 38: the routers' /arrivals answers only the pipeline's token (its Secret, mounted)
    arrivals = f"{cluster.agent.proxy.url(NAME)}/arrivals?after=0"
    assert http_json(arrivals)[0] == 401
    token = secret_token(cluster.api.get("secrets", f"{NAME}-router-token") or {})
    code, doc = http_json(arrivals, token=token)
    assert code == 200 and doc["total"] >= 1, doc

    # the operator reads the router pods' latency histograms (the trailing window) into status
    measured = wait_for(
        lambda: _status(cluster).get("measuredP99Ms"),
        timeout=SLOW,
        what="status.measuredP99Ms",
        period=1.0,
    )
    assert measured > 0 and _status(cluster)["measuredQueries"] >= MIN_QUERIES

    # each stage's tuner read the arrivals its real pods saw
    for model in models:
        wait_for(
            lambda m=model: (
                ((cluster.status(m).get("autoscaling") or {}).get("envelope") or {}).get("pods", 0)
                >= 1
            ),
            timeout=SLOW,
            what=f"{model}'s tuner reading its pods' arrivals",
            period=1.0,
            detail=lambda m=model: f"status: {cluster.status(m)}",
        )

    events = {e.get("reason") for e in cluster.events()}
    assert {"StageCreated", "Provisioned"} <= events, events

    # delete: the stage models, the router and the Service go with the pipeline
    cluster.api.delete("packratpipelines", NAME)

    def gone() -> bool:
        return (
            cluster.api.get("packratpipelines", NAME) is None
            and not any(cluster.api.get("packratmodels", m) for m in models)
            and cluster.api.get("deployments", f"{NAME}-router") is None
            and cluster.api.get("configmaps", f"{NAME}-router") is None
            and cluster.api.get("services", NAME) is None
            and not cluster.api.list("deployments")
            and not cluster.agent.running(f"{NAME}-router")
        )

    wait_for(
        gone,
        timeout=SLOW,
        what="the pipeline and everything it owns deleted",
        period=0.5,
        detail=lambda: (
            f"models: {[o['metadata']['name'] for o in cluster.api.list('packratmodels')]}, "
            f"deployments: {[o['metadata']['name'] for o in cluster.api.list('deployments')]}, "
            f"services: {[o['metadata']['name'] for o in cluster.api.list('services')]}"
        ),
    )
