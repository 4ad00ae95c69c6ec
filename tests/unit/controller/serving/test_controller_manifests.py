"""Every object the operator builds is a valid Kubernetes object with Guaranteed-QoS pods."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from packrat.controller.core.model import parse
from packrat.controller.profiling import manifests as pm
from packrat.controller.serving import manifests as m

OWNER: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "tiny", "namespace": "ns", "uid": "1234"},
    "spec": {
        "model": {"zoo": "tiny"},
        "cpus": 4,
        "batchSize": 8,
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "profiling": {"threads": [1, 2, 4]},
    },
}
URI_OWNER: dict[str, Any] = {
    **OWNER,
    "spec": {
        "model": {"uri": "https://h/m.mar", "format": "mar", "sampleRequest": "eA=="},
        "cpus": 2,
        "batchSize": 4,
    },
}
PVC_OWNER: dict[str, Any] = {
    **OWNER,
    "spec": {
        "model": {
            "volume": {"persistentVolumeClaim": {"claimName": "models"}, "path": "r.pt"},
            "format": "torchscript",
        },
        "cpus": 2,
        "batchSize": 4,
    },
}
PLAN = {
    "cpus": 4,
    "batch": 8,
    "label": "2x2t/b4",
    "instances": [{"threads": 2, "batch": 4, "count": 2, "latency_ms": 1.0}],
}
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def _objects(owner: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        pm.profiling_job(parse(owner)),
        pm.profile_configmap(parse(owner), profile_json="{}", cpu_model="x"),
        m.serving_deployment(parse(owner), slot="a", serving_hash="h1", replicas=2),
        m.service(owner, slot="b"),
    ]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] in ("Job", "Deployment"):
        return [obj["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("owner", [OWNER, URI_OWNER, PVC_OWNER], ids=["zoo", "uri", "pvc"])
def test_objects_validate_strict(owner: dict[str, Any], version: str) -> None:
    for obj in _objects(owner):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("owner", [OWNER, URI_OWNER, PVC_OWNER], ids=["zoo", "uri", "pvc"])
def test_pods_are_guaranteed_and_locked_down(owner: dict[str, Any]) -> None:
    pods = [p for obj in _objects(owner) for p in _pod_specs(obj)]
    assert len(pods) == 2
    for pod in pods:
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        containers = pod["containers"] + pod.get("initContainers", [])
        if "uri" in owner["spec"]["model"]:
            assert any(c["name"] == "fetch-model" for c in containers)
        for c in containers:
            res = c["resources"]
            assert res["requests"] == res["limits"], c["name"]
            assert res["limits"]["cpu"] == str(owner["spec"]["cpus"])
            assert int(res["limits"]["cpu"]) >= 1
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert (
                any(v["mountPath"] == "/tmp" for v in c["volumeMounts"]) or c["name"] == "publish"
            )


def test_deployment_serves_plan_with_probes() -> None:
    dep = m.serving_deployment(parse(OWNER), slot="b", serving_hash="h1", replicas=3)
    assert dep["metadata"]["name"] == "tiny-b"
    assert dep["spec"]["replicas"] == 3
    tpl = dep["spec"]["template"]
    assert tpl["metadata"]["labels"]["packrat.dev/slot"] == "b"
    assert tpl["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert tpl["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    assert tpl["spec"]["nodeSelector"] == {"pool": "cpu"}
    c = tpl["spec"]["containers"][0]
    assert c["command"][:2] == ["packrat", "serve"]
    assert c["command"][c["command"].index("--plan-env") + 1] == "PACKRAT_PLAN"
    assert c["command"][c["command"].index("--port") + 1] == "8080"
    # the plan comes from the slot's plan ConfigMap
    env = {e["name"]: e for e in c["env"]}
    assert env["PACKRAT_PLAN"]["valueFrom"] == {
        "configMapKeyRef": {"name": "tiny-b-plan", "key": "plan.json"}
    }
    # the admin token is a file from the model's Secret, in no process's environment
    assert "PACKRAT_ADMIN_TOKEN" not in env
    token_file = c["command"][c["command"].index("--admin-token-file") + 1]
    (mount,) = [m for m in c["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in tpl["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "tiny-admin-token" and mount["readOnly"] is True
    assert token_file.endswith("/token")
    assert "packrat.dev/plan-hash" not in tpl["metadata"]["annotations"]
    assert "packrat.dev/plan" not in tpl["metadata"]["annotations"]
    for probe in ("readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/ping"
    # a restarting worker or a draining pod leaves the Service (/ping) but is not killed
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ref = dep["metadata"]["ownerReferences"][0]
    assert ref["uid"] == "1234" and ref["controller"] is True
    # a background delete leaves its pods serving until the operator lets it go
    assert dep["metadata"]["finalizers"] == ["packrat.dev/serving"]


def test_job_profiles_and_publishes() -> None:
    typed = parse(OWNER)
    job = pm.profiling_job(typed)
    assert job["metadata"]["name"] == f"tiny-profile-{typed.profile_key[:8]}"
    spec = job["spec"]
    assert spec["backoffLimit"] == 2 and spec["activeDeadlineSeconds"] == 1800
    init = spec["template"]["spec"]["initContainers"][-1]
    assert init["command"][:2] == ["packrat", "profile"]
    assert init["command"][init["command"].index("--threads") + 1] == "1,2,4"
    assert init["command"][init["command"].index("-o") + 1] == "/profile/profile.json"
    assert spec["template"]["spec"]["containers"][0]["command"] == ["cat", "/profile/profile.json"]


def test_service_selects_slot() -> None:
    svc = m.service(OWNER, slot="b")
    assert svc["metadata"]["name"] == "tiny"
    assert svc["spec"]["selector"]["packrat.dev/slot"] == "b"
    assert svc["spec"]["ports"][0]["port"] == 8080
