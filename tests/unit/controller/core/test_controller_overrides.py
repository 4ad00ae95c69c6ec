"""spec.pod overrides: applied to serving and profiling pods, Guaranteed QoS kept, bad refused."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from packrat.controller.core.model import model_spec, parse
from packrat.controller.core.spec import validate_spec
from packrat.controller.profiling import manifests as pm
from packrat.controller.serving import manifests as m

POD = {
    "annotations": {"sidecar.istio.io/inject": "false", "team": "vision"},
    "labels": {"team": "vision", "cost-center": "42"},
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "model-reader",
    "priorityClassName": "serving-high",
    "env": [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}},
    ],
}
PLAN = {
    "cpus": 2,
    "batch": 4,
    "label": "2x1t/b2",
    "instances": [{"threads": 1, "batch": 2, "count": 2, "latency_ms": 1.0}],
}


def owner(pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u1"},
        "spec": {
            "model": {"uri": "https://h/m.mar", "format": "mar", "sampleRequest": "eA=="},
            "cpus": 2,
            "batchSize": 4,
            "pod": pod,
        },
    }


def _pods() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    body = owner(POD)
    job = pm.profiling_job(parse(body))
    dep = m.serving_deployment(parse(body), slot="a", serving_hash="h", replicas=1)
    for obj in (job, dep):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    return [(o["spec"]["template"]["metadata"], o["spec"]["template"]["spec"]) for o in (job, dep)]


def test_overrides_reach_both_pods_and_keep_guaranteed_qos() -> None:
    assert validate_spec(owner(POD)["spec"], name="m") == []
    for meta, spec in _pods():
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
        assert meta["labels"]["team"] == "vision"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == m.MANAGER  # ours kept
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert spec["serviceAccountName"] == "model-reader"
        assert spec["priorityClassName"] == "serving-high"
        assert spec["automountServiceAccountToken"] is False
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            names = [e["name"] for e in container["env"]]
            assert names[-2:] == ["HTTPS_PROXY", "TOKEN"] and len(names) == len(set(names))
            res = container["resources"]
            assert res["requests"] == res["limits"] and res["limits"]["cpu"] == "2"


def test_overrides_change_the_serving_hash() -> None:
    plain = owner(None)["spec"]
    plain.pop("pod")
    with_pod = owner(POD)["spec"]
    assert model_spec(plain, image="i").serving_hash(PLAN) != model_spec(
        with_pod, image="i"
    ).serving_hash(PLAN)


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        ({"resources": {"limits": {"cpu": "1"}}}, "resources stay requests == limits"),
        ({"containers": []}, "not allowed"),
        ({"labels": {"app.kubernetes.io/name": "x"}}, "reserved for the operator"),
        ({"labels": {"packrat.dev/slot": "a"}}, "reserved for the operator"),
        ({"annotations": {"packrat.dev/plan": "x"}}, "reserved for the operator"),
        ({"labels": {"team": "has space"}}, "not a valid label value"),
        ({"labels": {"bad key!": "x"}}, "not a valid key"),
        ({"env": [{"name": "OMP_NUM_THREADS", "value": "8"}]}, "set the operator's variables"),
        ({"env": [{"name": "PACKRAT_PLAN", "value": "{}"}]}, "set the operator's variables"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "repeats"),
        ({"env": [{"name": "A"}]}, "exactly one of value and valueFrom"),
        ({"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {}}}]}, "valueFrom must be"),
        ({"serviceAccountName": "Bad_Name"}, "DNS subdomain"),
        ({"imagePullSecrets": ["registry"]}, "imagePullSecrets[0] must be an object"),
        ("everything", "spec.pod must be an object"),
    ],
)
def test_bad_overrides_are_refused(pod: Any, needle: str) -> None:
    errors = validate_spec(owner(pod)["spec"], name="m")
    assert any(needle in e for e in errors), errors
