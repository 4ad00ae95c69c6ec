"""A PackratPool in a cluster that does not play along: objects under its children's names
that it does not own (never adopted, edited or deleted: a condition that names them and the
pool, and one Warning event, not one per pass), its ConfigMap edited by hand or deleted
(converges back)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kube_support import FakeKube

from packrat.controller.core.context import Config, Result
from packrat.controller.core.overrides import ModelPolicy
from packrat.controller.core.spec import validate_spec
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.pool import manifests as pm
from packrat.controller.pool import spec as spec_module
from packrat.controller.pool.readings import Hosted
from packrat.controller.pool.reconcile import PoolReconciler

NS = "ns"


def _setup(kube: FakeKube) -> None:
    spec = {"weightBudget": "64Mi", "memory": "1Gi", "replicas": 1}
    meta = {"name": "p", "namespace": NS, "uid": "pool-uid"}
    kube.create("packratpools", NS, {"metadata": meta, "spec": spec})
    model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
    kube.create(
        "packratmodels",
        NS,
        {"metadata": {"name": "a", "namespace": NS, "uid": "a-uid"}, "spec": model},
    )


def _conditions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    status = (kube.get("packratpools", NS, "p") or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def _warnings(result: Result) -> list[str]:
    return [message for kind, reason, message in result.events if reason == "OwnershipConflict"]


def test_a_foreign_object_under_a_childs_name_is_a_condition_and_one_warning(
    kube: FakeKube,
) -> None:
    _setup(kube)
    foreign = {"metadata": {"name": "p"}, "spec": {"selector": {"app": "mine"}}}
    kube.create("services", NS, foreign)
    pools = PoolReconciler(kube)
    first = pools.reconcile(NS, "p")
    conflict = _conditions(kube)["OwnershipConflict"]
    assert conflict["status"] == "True" and "Service p" in conflict["message"]
    assert conflict["message"].endswith("or rename the pool")  # it said "the pipeline"
    assert _warnings(first) == [conflict["message"]]
    assert _warnings(pools.reconcile(NS, "p")) == []  # once, not every pass
    assert (kube.get("services", NS, "p") or {})["spec"] == foreign["spec"]  # untouched
    kube.delete("services", NS, "p")
    pools.reconcile(NS, "p")
    resolved = _conditions(kube)["OwnershipConflict"]
    assert resolved["status"] == "False" and resolved["reason"] == "Resolved"
    svc = kube.get("services", NS, "p") or {}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"


def test_the_pods_configmap_edited_by_hand_or_deleted_converges_back(kube: FakeKube) -> None:
    _setup(kube)
    pools = PoolReconciler(kube)
    pools.reconcile(NS, "p")
    written = (kube.get("configmaps", NS, "p-0") or {})["data"]
    kube.patch("configmaps", NS, "p-0", {"data": {pm.CONFIG_KEY: '{"models": []}'}})
    pools.reconcile(NS, "p")
    assert (kube.get("configmaps", NS, "p-0") or {})["data"] == written
    kube.delete("configmaps", NS, "p-0")
    pools.reconcile(NS, "p")
    assert (kube.get("configmaps", NS, "p-0") or {})["data"] == written
    assert "OwnershipConflict" not in _conditions(kube)


@pytest.mark.parametrize("name", ["p" * 61, "my.pool", "1pool"])
def test_a_pool_whose_name_its_children_cannot_carry_is_invalid_and_says_so(
    kube: FakeKube, name: str
) -> None:
    """A PackratPool may be named anything the API server takes (253 characters, dots, a
    digit first); its Service and its pods' ``<pool>-<i>`` label values may not. Before, its
    pass wrote them anyway (the API server refuses: the pass failed every time, its status
    silent); now it is Failed with a condition and creates nothing; a model's ``spec.pool``
    cannot name it (the CRD's pattern)."""
    spec = {"weightBudget": "64Mi", "memory": "1Gi", "replicas": 1}
    kube.create("packratpools", NS, {"metadata": {"name": name, "uid": "u"}, "spec": spec})
    PoolReconciler(kube).reconcile(NS, name)
    status = (kube.get("packratpools", NS, name) or {}).get("status") or {}
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert status["phase"] == "Failed" and ready["reason"] == "InvalidSpec"
    assert "metadata.name must be a DNS label of at most 60" in ready["message"]
    assert kube.of("deployments") == [] and kube.of("services") == []
    assert kube.of("configmaps") == [] and kube.of("secrets") == []
    model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": name}
    assert any("spec.pool" in e for e in validate_spec(model, name="a"))


def test_a_model_whose_pool_is_invalid_says_so(kube: FakeKube) -> None:
    """Its Placed condition said "has not placed the model yet" (as if it would, in time)."""
    spec = {"weightBudget": "2Gi", "memory": "1Gi", "replicas": 1}  # the budget above memory
    kube.create(
        "packratpools", NS, {"metadata": {"name": "p", "namespace": NS, "uid": "u"}, "spec": spec}
    )
    model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
    kube.create(
        "packratmodels",
        NS,
        {"metadata": {"name": "a", "namespace": NS, "uid": "a-uid"}, "spec": model},
    )
    PoolReconciler(kube).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    model_status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
    placed = {c["type"]: c for c in model_status["conditions"]}["Placed"]
    assert placed["status"] == "False" and placed["reason"] == "PoolInvalid"
    assert "pool p is invalid: spec.weightBudget must be below spec.memory" in placed["message"]


def test_a_foreign_deployment_under_a_pods_name_gets_no_models_traffic(kube: FakeKube) -> None:
    """A Deployment ``p-0`` that is not the pool's, its pods labelled as pool pod ``p-0`` and
    serving the pool's own ConfigMap (the digest matches): the pool reported the model ready
    there and the model's Service moved to those pods. Now a pod whose Deployment is not
    the pool's is not read: the model waits, the conflict says why."""
    _setup(kube)
    labels = pm.pod_labels("p", "p-0")
    squatter = {"metadata": {"name": "p-0", "labels": labels}, "spec": {"replicas": 1}}
    kube.create("deployments", NS, squatter)
    asked: list[str] = []

    def reader(namespace: str, pool: str, expected: Any, *, token: Any = None) -> Any:
        asked.extend(expected)  # every pod asked serves the config the pool wrote last
        digest = pm.config_digest(kube.get("configmaps", NS, "p-0") or {})
        return {pod: {n: Hosted(pod, 1, 2, 3, 1, 0.0, digest) for n in expected[pod]}
                for pod in expected}  # fmt: skip

    PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    assert asked == []
    record = ((kube.get("packratpools", NS, "p") or {}).get("status") or {})["models"]["a"]
    assert record["ready"] is False
    assert "Deployment p-0" in _conditions(kube)["OwnershipConflict"]["message"]
    Reconciler(kube).reconcile(NS, "a")
    assert kube.get("services", NS, "a") is None
    assert (kube.get("deployments", NS, "p-0") or {})["spec"] == squatter["spec"]


def test_a_flood_of_new_models_never_pushes_out_one_the_pool_serves(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the pool's cap the members were the first by name: models ``a`` and ``b``,
    created by anyone who may create models in the namespace, took the places and ``z``,
    served by the pool, was dropped from its pod's config (an outage). Now the models it
    serves keep their places, then the oldest; the rest are unplaced, saying why."""
    monkeypatch.setattr(spec_module, "MAX_MODELS", 2)
    _setup(kube)  # model a asks for p
    spec = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
    served = {"pool": {"name": "p", "pod": "p-0"}}
    kube.create("packratmodels", NS, {"metadata": {"name": "z"}, "spec": spec, "status": served})
    kube.create("packratmodels", NS, {"metadata": {"name": "b"}, "spec": spec})
    PoolReconciler(kube).reconcile(NS, "p")
    status = (kube.get("packratpools", NS, "p") or {}).get("status") or {}
    assert sorted(status["models"]) == ["a", "z"]
    assert "at most 2 models" in status["unplaced"]["b"]
    config = (kube.get("configmaps", NS, "p-0") or {})["data"][pm.CONFIG_KEY]
    assert sorted(m["name"] for m in json.loads(config)["models"]) == ["a", "z"]


def test_the_image_allow_list_binds_a_pools_pods_as_it_binds_a_models(kube: FakeKube) -> None:
    """``--allow-image`` refused a model's ``spec.image`` outside it, but a PackratPool's
    ``spec.image`` ran whatever it named: the pool was the way around the allow-list."""
    config = Config(policy=ModelPolicy.parse(images=["registry.example/packrat/*"]))
    _setup(kube)
    kube.patch("packratpools", NS, "p", {"spec": {"image": "anyone.example/miner:1"}})
    pools = PoolReconciler(kube, config=config)
    first = pools.reconcile(NS, "p")
    status = (kube.get("packratpools", NS, "p") or {}).get("status") or {}
    ready = _conditions(kube)["Ready"]
    assert status["phase"] == "Failed" and ready["reason"] == "PolicyRefused"
    assert "anyone.example/miner:1" in ready["message"]
    assert [r for _, r, _ in first.events] == ["PolicyRefused"]
    assert [r for _, r, _ in pools.reconcile(NS, "p").events] == []  # once
    assert kube.of("deployments") == []
    kube.patch("packratpools", NS, "p", {"spec": {"image": "registry.example/packrat/pool:2"}})
    pools.reconcile(NS, "p")
    (container,) = (kube.get("deployments", NS, "p-0") or {})["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == "registry.example/packrat/pool:2"


def test_a_model_the_pool_cannot_place_is_one_warning_not_one_per_pass(kube: FakeKube) -> None:
    """The pool said why in its Placed condition only: no event, so ``kubectl get events``
    (where a user looks first when a model never answers) showed nothing."""
    _setup(kube)
    kube.patch("packratpools", NS, "p", {"spec": {"weightBudget": "1Mi"}})  # tiny: 2 MiB
    pools = PoolReconciler(kube)
    first = [(k, r) for k, r, m in pools.reconcile(NS, "p").events if "a:" in m]
    assert first == [("Warning", "NotPlaced")]
    assert pools.reconcile(NS, "p").events == []
    assert _conditions(kube)["Placed"]["reason"] == "NotPlaced"


def test_a_model_the_pool_will_not_serve_says_why_in_ready_too(kube: FakeKube) -> None:
    """Its Placed condition said why (too large, no such pool, the pool invalid) but Ready
    said "waiting for pool p to serve it", as if a wait would do."""
    _setup(kube)
    kube.patch("packratpools", NS, "p", {"spec": {"weightBudget": "1Mi"}})  # tiny: 2 MiB
    PoolReconciler(kube).reconcile(NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["reason"] == "NotPlaced"
    assert conditions["Ready"]["message"] == conditions["Placed"]["message"]
    assert "budget" in conditions["Ready"]["message"]
    kube.patch("packratmodels", NS, "a", {"spec": {"pool": "q"}})
    Reconciler(kube).reconcile(NS, "a")
    status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["reason"] == "PoolNotFound" and "no PackratPool q" in ready["message"]


def test_a_served_pod_is_one_of_the_pools_pod_names_not_any_name_a_status_holds(
    kube: FakeKube,
) -> None:
    """A model's ``status.pool.pod`` (writable by whoever may write status) naming
    ``p-evil``: the pool made a Deployment and ConfigMap ``p-evil`` to keep serving it."""
    _setup(kube)
    kube.patch_status(
        "packratmodels", NS, "a", {"status": {"pool": {"name": "p", "pod": "p-evil"}}}
    )
    PoolReconciler(kube).reconcile(NS, "p")
    assert kube.of("deployments") == ["p-0"] and sorted(kube.of("configmaps")) == ["p-0"]
