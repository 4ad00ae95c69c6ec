"""The in-pod switch in the reconcile pass (issue 14): the plan in the slot's ConfigMap, the
admin token Secret, and the pass that posts a new plan to the active slot's pods or falls back
to the Deployment switch. Builders are checked on their output; the pass against the
in-memory API with a fake pod client that records what it was asked."""

from __future__ import annotations

import base64
import copy
import datetime
import json
from collections.abc import Mapping
from typing import Any

import pytest
from kube_support import NS, T0, FakeKube, ModelSetUp, ready_model, serving_pod, set_spec

from packrat.controller.core.plans import from_status
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.serving import manifests as m
from packrat.controller.serving.admin_token import admin_token_secret, secret_token
from packrat.controller.serving.pod_config import plan_configmap
from packrat.controller.switch.inpod import PodClient, failures, slot_pods
from packrat.controller.switch.plan_poster import PlanPost, PodAnswer

OWNER = {"metadata": {"name": "tiny", "namespace": NS, "uid": "u1"}, "spec": {}}
PLAN = from_status(
    {
        "label": "2x1t/b2",
        "cpus": 2,
        "batch": 4,
        "instances": [{"threads": 1, "batch": 2, "count": 2}],
        "expectedLatencyMs": 1.8,
    }
)
assert PLAN is not None


# ------------------------------------------------------------------------------- builders
def test_plan_configmap_holds_the_wire_plan_owned_and_labelled() -> None:
    cm = plan_configmap(OWNER, slot="b", plan=PLAN)
    assert cm["metadata"] == {
        "name": "tiny-b-plan",
        "namespace": NS,
        "labels": {
            "app.kubernetes.io/name": "packrat-serving",
            "app.kubernetes.io/instance": "tiny",
            "app.kubernetes.io/managed-by": "packrat-operator",
            "packrat.dev/model": "tiny",
            "packrat.dev/slot": "b",
        },
        "ownerReferences": [
            {
                "apiVersion": "packrat.dev/v1alpha1",
                "kind": "PackratModel",
                "name": "tiny",
                "uid": "u1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "annotations": {"packrat.dev/plan": "2x1t/b2"},
    }
    wire = json.loads(cm["data"]["plan.json"])  # what `packrat serve --plan-env` reads
    assert wire["batch"] == 4 and wire["expected_latency_ms"] == 1.8
    assert wire["instances"] == [{"threads": 1, "batch": 2, "count": 2}]
    assert list(cm["data"]) == [m.PLAN_KEY]


def test_admin_token_secret_round_trip_and_junk() -> None:
    secret = admin_token_secret(OWNER, token="t" * 43, now=T0)
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    assert secret["metadata"]["name"] == "tiny-admin-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert secret_token(secret) == "t" * 43
    assert secret_token({"data": {"token": base64.b64encode(b"short").decode()}}) is None
    assert secret_token({"data": {"token": "%%%not base64"}}) is None
    assert secret_token({"data": {}}) is None and secret_token({}) is None


def test_slot_pods_and_failures() -> None:
    ready, others = slot_pods(
        [serving_pod("p1"), serving_pod("p2", ready=False), serving_pod("p3", going=True)]
    )
    assert [p["metadata"]["name"] for p in ready] == ["p1"] and others == ["p2"]
    answers = [PodAnswer(True, 200, ""), PodAnswer(False, 503, "no"), PodAnswer(False, 0, "x")]
    assert failures(["a", "b", "c"], answers) == ["b: 503 no", "c: unreachable x"]


# ------------------------------------------------------------------------------- the pass
class FakePods:
    """Answers per pod URL (200 by default) and the requests it got."""

    def __init__(self, answers: Mapping[str, int] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[list[str], Any, str, float]] = []

    def __call__(self, post: PlanPost) -> list[PodAnswer]:
        self.calls.append((list(post.urls), post.plan, post.token, post.timeout))
        out = []
        for url in post.urls:
            code = self.answers.get(url, 200)
            out.append(PodAnswer(ok=code == 200, status=code, message="" if code == 200 else "x"))
        return out


def _served(pods: FakePods, *names: str) -> tuple[FakeKube, Reconciler]:
    kube, rec = ready_model()
    for name in names:
        kube.create("pods", NS, serving_pod(name))
    return kube, Reconciler(kube, config=rec.config, pods=PodClient("http://{pod}:8080", pods))


def _cm_batch(kube: FakeKube, slot: str) -> int:
    cm = kube.get("configmaps", NS, f"tiny-{slot}-plan")
    assert cm is not None
    return int(json.loads(cm["data"]["plan.json"])["batch"])


def _token(kube: FakeKube) -> str:
    secret = kube.get("secrets", NS, "tiny-admin-token")
    assert secret is not None
    token = secret_token(secret)
    assert token is not None
    return token


def test_a_batch_change_switches_in_the_pods_without_touching_the_deployment() -> None:
    pods = FakePods()
    kube, rec = _served(pods, "tiny-a-1", "tiny-a-2")
    before = copy.deepcopy(kube.get("deployments", NS, "tiny-a"))
    set_spec(kube, batchSize=8)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    # every ready pod of the active slot got the new plan, with the model's token
    ((urls, plan, token, timeout),) = pods.calls
    assert sorted(urls) == ["http://tiny-a-1:8080", "http://tiny-a-2:8080"]
    assert plan.batch == 8 and token == _token(kube) and timeout == 60
    # the ConfigMap has it (a restarted pod starts on it), the Deployment is as it was
    assert _cm_batch(kube, "a") == 8
    assert kube.get("deployments", NS, "tiny-a") == before
    assert kube.of("deployments") == ["tiny-a"]  # no slot b, no new pod
    assert status["activeSlot"] == "a" and status["plan"]["batch"] == 8
    assert "switch" not in status and res.phase == "Ready"
    last = status["lastSwitch"]
    assert last["mode"] == "InPod" and last["result"] == "Succeeded"
    assert last["fromSlot"] == last["toSlot"] == "a" and "batch 4 -> 8" in last["reason"]
    assert status["switchHistory"][-1]["toBatch"] == 8
    assert status["batchSize"]["current"] == 8 and "target" not in status["batchSize"]
    assert res.switch_result == "succeeded" and res.switch_seconds is not None
    assert ("Normal", "SwitchCompleted") in [(k, r) for k, r, _ in res.events]
    # the next pass has nothing to do
    n = len(kube.patches)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))
    assert len(pods.calls) == 1 and res.phase == "Ready"
    assert [p for p in kube.patches[n:] if p[0] != "packratmodels"] == []


def test_a_pass_that_finds_the_configmap_updated_converges() -> None:
    # an earlier pass updated the ConfigMap and stopped before status was written: the next
    # one posts again to every pod (one already on the plan answers 200 at once)
    pods = FakePods()
    kube, rec = _served(pods, "tiny-a-1")
    set_spec(kube, batchSize=8)
    cm = kube.get("configmaps", NS, "tiny-a-plan")
    assert cm is not None
    wire = json.loads(cm["data"]["plan.json"])
    kube.patch("configmaps", NS, "tiny-a-plan", {"data": {"plan.json": json.dumps(wire)}})
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    assert len(pods.calls) == 1 and kube.prm()["status"]["plan"]["batch"] == 8


@pytest.mark.parametrize(
    ("answers", "extra", "why"),
    [
        ({"http://tiny-a-2:8080": 503}, [], "1/2 pods did not switch"),
        ({"http://tiny-a-2:8080": 401}, [], "tiny-a-2: 401"),
        ({}, [serving_pod("tiny-a-3", ready=False)], "2/3 pods of slot a ready"),
    ],
)
def test_a_pod_that_does_not_switch_falls_back_to_the_deployment_switch(
    answers: dict[str, int], extra: list[dict[str, Any]], why: str
) -> None:
    pods = FakePods(answers)
    kube, rec = _served(pods, "tiny-a-1", "tiny-a-2")
    for pod in extra:
        kube.create("pods", NS, pod)
    set_spec(kube, batchSize=8)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    assert status["switch"]["stage"] == "rollout" and status["switch"]["targetSlot"] == "b"
    assert (
        why in status["switch"]["reason"] and "in-pod switch failed" in status["switch"]["reason"]
    )
    warnings = [msg for k, r, msg in res.events if (k, r) == ("Warning", "InPodSwitchFailed")]
    assert len(warnings) == 1 and why in warnings[0]
    # the active slot's ConfigMap has the served plan back; slot b's has the new one
    assert _cm_batch(kube, "a") == 4 and _cm_batch(kube, "b") == 8
    assert status["plan"]["batch"] == 4 and status["activeSlot"] == "a"
    # the Deployment switch goes on as before: slot b ready, Service moved, drained
    kube.make_ready("tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))
    status = kube.prm()["status"]
    assert status["activeSlot"] == "b" and status["plan"]["batch"] == 8
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=20))
    status = kube.prm()["status"]
    assert "switch" not in status and status["lastSwitch"]["mode"] == "Deployment"
    assert len(pods.calls) == (0 if extra else 1)


def test_a_cores_change_keeps_the_deployment_switch() -> None:
    pods = FakePods()
    kube, rec = _served(pods, "tiny-a-1")
    set_spec(kube, cpus=1, batchSize=2, profiling={"maxBatch": 8, "threads": [1]})
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    assert pods.calls == []
    if "switch" in status:  # (a re-profile for 1 cpu may come first)
        assert status["switch"]["targetSlot"] == "b"
        assert "in-pod" not in status["switch"]["reason"]


def test_a_memory_change_with_a_batch_change_keeps_the_deployment_switch() -> None:
    pods = FakePods()
    kube, rec = _served(pods, "tiny-a-1")
    set_spec(kube, batchSize=8, memory="8Gi")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    assert pods.calls == [] and kube.prm()["status"]["switch"]["targetSlot"] == "b"
    assert ("Warning", "InPodSwitchFailed") not in [(k, r) for k, r, _ in res.events]


def test_without_a_pod_client_every_plan_change_switches_slots(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    assert kube.prm()["status"]["switch"]["targetSlot"] == "b"
    # the passive slot is rendered for the plan: its pods' template says which
    dep = kube.get("deployments", NS, "tiny-b")
    assert dep is not None
    assert dep["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_PLAN_HASH]
    assert _cm_batch(kube, "b") == 8
