"""A PackratPool's pass against the in-memory API server: its children created and owned,
never adopted, a pod no model needs removed, models placed and unplaced with the reason;
a pooled model's pass points its Service at its pool pod only once the pod serves it.
The pods' ``/pool/status`` comes from a stand-in reader (the real one is tested with the
pool process in tests/integration/test_operator_pool.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from kube_support import FakeKube

from packrat.controller.model.reconcile import Reconciler
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.readings import Hosted
from packrat.controller.pool.reconcile import PoolReconciler
from packrat.controller.pool.wiring import Signatures, membership, placements
from packrat.controller.serving.admin_token import secret_token

NS = "ns"


class Reader:
    """Every pod serves every model it was asked to host, under the config it was given last
    (``serving`` False: none yet; ``stale``: under the config it had before)."""

    serving = True
    stale = False
    token: str | None = None

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    def _digest(self, namespace: str, pod: str) -> str:
        cm = self.kube.get("configmaps", namespace, pod)
        if self.stale or cm is None or pm.CONFIG_KEY not in (cm.get("data") or {}):
            return "0" * 64  # an old config, or a ConfigMap not the pool's
        return pm.config_digest(cm)

    def __call__(
        self,
        namespace: str,
        pool: str,
        expected: Mapping[str, Collection[str]],
        *,
        token: str | None = None,
    ) -> dict[str, dict[str, Hosted]]:
        self.token = token
        if not self.serving:
            return {}
        return {
            pod: {n: Hosted(pod, 10, 20, 1, 1, 0.0, self._digest(namespace, pod)) for n in names}
            for pod, names in expected.items()
        }


def _setup(kube: FakeKube, *, replicas: int = 1, budget: str = "64Mi") -> None:
    spec = {"weightBudget": budget, "memory": "1Gi", "replicas": replicas}
    kube.create(
        "packratpools",
        NS,
        {"metadata": {"name": "p", "namespace": NS, "uid": "pool-uid"}, "spec": spec},
    )
    for name in ("a", "b"):
        model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
        kube.create(
            "packratmodels",
            NS,
            {"metadata": {"name": name, "namespace": NS, "uid": f"{name}-uid"}, "spec": model},
        )


def _status(kube: FakeKube, resource: str, name: str) -> dict[str, Any]:
    return (kube.get(resource, NS, name) or {}).get("status") or {}


def test_pool_pass_creates_owned_children_and_places_models(kube: FakeKube) -> None:
    _setup(kube, replicas=2)
    reader = Reader(kube)
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    status = _status(kube, "packratpools", "p")
    assert status["phase"] == "Serving" and status["placedModels"] == 2
    assert {r["pod"] for r in status["models"].values()} <= {"p-0", "p-1"}
    for resource in ("deployments", "configmaps"):
        for obj in kube.list(resource, NS, labels=pm.pool_labels("p")):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert kube.get("services", NS, "p") is not None
    # fewer pods: the models move, and the pod no model needs goes
    kube.patch("packratpools", NS, "p", {"spec": {"replicas": 1}})
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    assert {r["pod"] for r in _status(kube, "packratpools", "p")["models"].values()} == {"p-0"}
    assert kube.of("deployments") == ["p-0"]


def test_pool_never_adopts_an_object_under_its_names(kube: FakeKube) -> None:
    _setup(kube)
    kube.create("configmaps", NS, {"metadata": {"name": "p-0"}, "data": {"x": "mine"}})
    PoolReconciler(kube, reader=Reader(kube)).reconcile(NS, "p")
    assert (kube.get("configmaps", NS, "p-0") or {})["data"] == {"x": "mine"}
    assert kube.get("deployments", NS, "p-0") is None
    conditions = {c["type"]: c for c in _status(kube, "packratpools", "p")["conditions"]}
    assert conditions["OwnershipConflict"]["status"] == "True"


def test_unplaced_model_says_why_in_its_condition(kube: FakeKube) -> None:
    _setup(kube, budget="1Mi")  # the tiny model's estimate is 2 MiB
    PoolReconciler(kube, reader=Reader(kube)).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    placed = {c["type"]: c for c in _status(kube, "packratmodels", "a")["conditions"]}["Placed"]
    assert placed["status"] == "False" and placed["reason"] == "NotPlaced"
    assert "budget" in placed["message"]
    assert kube.get("deployments", NS, "a-a") is None  # a pooled model deploys nothing


def test_model_service_moves_to_its_pool_pod_once_the_pod_serves_it(kube: FakeKube) -> None:
    _setup(kube)
    reader = Reader(kube)
    reader.serving = False
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    assert kube.get("services", NS, "a") is None
    assert _status(kube, "packratmodels", "a")["phase"] == "Pending"
    reader.serving = True
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    svc = kube.get("services", NS, "a") or {}
    assert pm.pod_of_service(svc) == "p-0"
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "a-uid"
    status = _status(kube, "packratmodels", "a")
    assert status["phase"] == "Ready" and status["pool"]["pod"] == "p-0"
    assert status["pool"]["residentBytes"] == 10
    # the pool deleted: the model says it is not served, rather than Ready on a gone pod
    kube.delete("packratpools", NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    ready = {c["type"]: c for c in _status(kube, "packratmodels", "a")["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "NotPlaced"


def test_a_service_moves_only_to_a_pod_serving_the_config_written_last(kube: FakeKube) -> None:
    """A model moved out and straight back: its pool pod may still list it under the config
    it had before the move out (the kubelet refreshes a mounted ConfigMap late), and drop it
    when the config without it arrives. The Service moves only once the pod reports the
    digest of the config written last."""
    _setup(kube)
    reader = Reader(kube)
    reader.stale = True
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    record = _status(kube, "packratpools", "p")["models"]["a"]
    assert record["ready"] is True and record["current"] is False
    Reconciler(kube).reconcile(NS, "a")
    assert kube.get("services", NS, "a") is None  # listed, but under an old config
    reader.stale = False
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    assert _status(kube, "packratpools", "p")["models"]["a"]["current"] is True
    Reconciler(kube).reconcile(NS, "a")
    assert pm.pod_of_service(kube.get("services", NS, "a") or {}) == "p-0"
    reader.stale = True  # once moved, a later config change does not take it away
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    assert pm.pod_of_service(kube.get("services", NS, "a") or {}) == "p-0"
    assert _status(kube, "packratmodels", "a")["phase"] == "Ready"


def test_wake_ups_follow_placements_and_membership_not_counters() -> None:
    seen = Signatures()
    one = {"models": {"a": {"pod": "p-0", "ready": True, "requests": 1}}}
    two = {"models": {"a": {"pod": "p-0", "ready": True, "requests": 2}}}
    assert seen.news("p", placements(one), None)
    assert not seen.news("p", placements(two), "MODIFIED")  # only a counter moved
    moved = {"models": {"a": {"pod": "p-1", "ready": False}}}
    assert seen.news("p", placements(moved), "MODIFIED")
    model = {"metadata": {"generation": 1}, "spec": {"pool": "p"}}
    assert membership(model) == ("p", None, None, 1, None)
    planned = {**model, "status": {"poolPlan": {"threads": 2, "batch": 1, "cpus": 2}}}
    assert membership(planned)[-1] == (2, 1, 2)  # its plan: the pool pod's config changes


def test_pool_pods_mount_the_pools_token_and_the_reader_sends_it(kube: FakeKube) -> None:
    """Issue 38: ``/pool/status`` needs the pool's token: the pass makes the Secret (owned by
    the pool), the pods mount it read-only, the reader gets it; a Secret under its name that
    is not the pool's is a conflict, and no pod mounts it."""
    _setup(kube)
    reader = Reader(kube)
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    secret = kube.get("secrets", NS, "p-pool-token") or {}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert reader.token is not None and reader.token == secret_token(secret)
    pod = (kube.get("deployments", NS, "p-0") or {})["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(v for v in container["volumeMounts"] if v["name"] == "admin-token")
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "admin-token")
    assert volume["secret"]["secretName"] == "p-pool-token"
    flag = container["args"].index("--admin-token-file")
    assert container["args"][flag + 1].startswith(mount["mountPath"] + "/")


def test_pool_never_mounts_a_token_secret_it_does_not_own(kube: FakeKube) -> None:
    _setup(kube)
    kube.create("secrets", NS, {"metadata": {"name": "p-pool-token"}, "data": {}})
    reader = Reader(kube)
    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    assert kube.get("deployments", NS, "p-0") is None and reader.token is None
    conditions = {c["type"]: c for c in _status(kube, "packratpools", "p")["conditions"]}
    assert conditions["OwnershipConflict"]["status"] == "True"
    assert "Secret p-pool-token" in conditions["OwnershipConflict"]["message"]
