"""A pooled model keeps its own profile and plan, on the pool's pod shape (issue 39): its
profiling Job runs on the pool's cpus, a change of the pool's cpus re-profiles, its plan on
them is in ``status.poolPlan``, the pool's config carries the plan's threads, and the pool
places by demand (rate from two readings of the pod's counter x service time), saying why
a model whose demand fits no pod is over capacity. The pods' ``/pool/status`` comes from a
stand-in reader (the real one: tests/integration/test_operator_pool.py)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Collection, Mapping
from typing import Any

from kube_support import NS, T0, FakeKube, profile_json

from packrat.controller.core.context import Config
from packrat.controller.core.model import parse
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.member import pooled_spec
from packrat.controller.pool.readings import Hosted
from packrat.controller.pool.reconcile import PoolReconciler
from packrat.controller.pool.spec import members
from packrat.controller.profiling.manifests import profile_configmap

Expected = Mapping[str, Collection[str]]
Readings = dict[str, dict[str, Hosted]]


class Counting:
    """Every pod serves every model it hosts, with ``requests[model]`` served so far."""

    def __init__(self, kube: FakeKube) -> None:
        self.requests: dict[str, int] = {}
        self.kube = kube

    def __call__(self, ns: str, pool: str, expected: Expected, **_: Any) -> Readings:
        def hosted(pod: str, n: str) -> Hosted:
            cm = self.kube.get("configmaps", ns, pod)
            ours = cm is not None and pm.CONFIG_KEY in (cm.get("data") or {})
            digest = pm.config_digest(cm) if cm is not None and ours else ""
            return Hosted(pod, 10, 20, self.requests.get(n, 0), 0, 0.0, digest)

        return {pod: {n: hosted(pod, n) for n in names} for pod, names in expected.items()}


def _pool(kube: FakeKube, *, cpus: int = 2, replicas: int = 1) -> None:
    spec = {"cpus": cpus, "weightBudget": "64Mi", "memory": "1Gi", "replicas": replicas}
    meta = {"name": "p", "namespace": NS, "uid": "pool-uid"}
    kube.create("packratpools", NS, {"metadata": meta, "spec": spec})


def _model(kube: FakeKube, name: str = "a", **extra: Any) -> None:
    spec = {"model": {"zoo": "tiny"}, "cpus": 4, "batchSize": 1, "pool": "p", **extra}
    meta = {"name": name, "namespace": NS, "uid": f"{name}-uid"}
    kube.create("packratmodels", NS, {"metadata": meta, "spec": spec})


def _obj(kube: FakeKube, resource: str, name: str) -> dict[str, Any]:
    obj = kube.get(resource, NS, name)
    assert obj is not None
    return obj


def _condition(kube: FakeKube, name: str, type_: str) -> dict[str, Any]:
    conditions = _obj(kube, "packratmodels", name)["status"]["conditions"]
    return next(c for c in conditions if c["type"] == type_)


def _job_cpus(kube: FakeKube) -> list[str]:
    out = []
    for job in kube.list("jobs", NS):
        init = job["spec"]["template"]["spec"]["initContainers"]
        profile = next(c for c in init if c["name"] == "profile")
        out.append(profile["resources"]["limits"]["cpu"])
    return out


def _seed(kube: FakeKube, name: str, cpus: int) -> None:
    model = parse(_obj(kube, "packratmodels", name), default_image="img")
    body = profile_configmap(pooled_spec(model, cpus), profile_json=profile_json())
    kube.create("configmaps", NS, body)


def test_pooled_model_is_profiled_and_planned_on_the_pools_cpus(kube: FakeKube) -> None:
    rec = Reconciler(kube, config=Config(image="img"))
    _model(kube)
    rec.reconcile(NS, "a", now=T0)  # no pool yet: a condition says so, nothing is created
    assert _condition(kube, "a", "Placed")["reason"] == "PoolNotFound"
    assert kube.of("jobs") == [] and kube.of("deployments") == []
    _pool(kube, cpus=2)
    rec.reconcile(NS, "a", now=T0)
    assert _job_cpus(kube) == ["2"]  # the pool's cpus, not the model's 4
    obj = _obj(kube, "packratmodels", "a")
    model = parse(obj, default_image="img")
    assert obj["status"]["profile"]["key"] == pooled_spec(model, 2).profile_key
    assert pooled_spec(model, 2).profile_key != model.profile_key
    assert obj["status"]["phase"] == "Pending"  # waiting for its pool, not for its profile
    _seed(kube, "a", 2)
    rec.reconcile(NS, "a", now=T0)
    status = _obj(kube, "packratmodels", "a")["status"]
    plan = status["poolPlan"]
    assert (plan["pool"], plan["cpus"], plan["batch"]) == ("p", 2, 1)
    # the fake profile: batch 1 takes 0.8 ms on 2 threads, 1.0 ms on 1: the plan is fat
    assert plan["threads"] == 2 and plan["batch1LatencyMs"] == 0.8
    assert plan["plan"]["label"] == "1x2t/b1" and plan["plan"]["cpus"] == 2
    assert _condition(kube, "a", "Planned")["status"] == "True"
    assert kube.of("jobs") == [] and "plan" not in status  # status.plan: its own pods' only
    assert not any(d.startswith("a-") for d in kube.of("deployments"))
    # the pool pod's config carries the plan's threads and batch
    PoolReconciler(kube, reader=Counting(kube)).reconcile(NS, "p", now=T0)
    config = json.loads(_obj(kube, "configmaps", "p-0")["data"]["pool.json"])
    assert config["models"] == [{"name": "a", "spec": "tiny", "threads": 2, "batch": 1}]
    # a new pool shape: profiled again on it; the old plan is not used on the new shape
    kube.patch("packratpools", NS, "p", {"spec": {"cpus": 1}})
    rec.reconcile(NS, "a", now=T0)
    assert _job_cpus(kube) == ["1"]
    PoolReconciler(kube, reader=Counting(kube)).reconcile(NS, "p", now=T0)
    config = json.loads(_obj(kube, "configmaps", "p-0")["data"]["pool.json"])
    assert config["models"] == [{"name": "a", "spec": "tiny"}]


def test_profiled_threads_are_limited_to_the_pools_cpus(kube: FakeKube) -> None:
    _model(kube, profiling={"threads": [1, 2, 4]})
    model = parse(_obj(kube, "packratmodels", "a"), default_image="img")
    assert pooled_spec(model, 2).profiling.threads == (1, 2)
    assert pooled_spec(model, 2).cpus == 2
    _model(kube, "b", profiling={"threads": [4]})
    other = parse(_obj(kube, "packratmodels", "b"), default_image="img")
    assert pooled_spec(other, 2).profiling.threads is None  # 1..2, the default
    assert pooled_spec(model, 4) == model.on_cpus(4)


def _plan_status(kube: FakeKube, name: str, *, threads: int, latency_ms: float) -> None:
    record = {"pool": "p", "cpus": 1, "threads": threads, "batch": 1}
    kube.patch_status(
        "packratmodels",
        NS,
        name,
        {"status": {"poolPlan": {**record, "batch1LatencyMs": latency_ms}}},
    )


def test_pool_places_by_demand_and_says_why_a_model_is_over_capacity(kube: FakeKube) -> None:
    _pool(kube, cpus=1)
    for name in ("a", "b"):
        _model(kube, name)
        _plan_status(kube, name, threads=1, latency_ms=100.0)  # 0.1 core-seconds a request
    reader = Counting(kube)
    pools = PoolReconciler(kube, reader=reader)
    pools.reconcile(NS, "p", now=T0)  # the first reading: no rate yet
    record = _obj(kube, "packratpools", "p")["status"]["models"]["a"]
    assert record["demand"]["rate"] == 0 and record["demand"]["serviceMs"] == 100.0
    reader.requests = {"a": 100, "b": 20}
    later = T0 + datetime.timedelta(seconds=10)
    pools.reconcile(NS, "p", now=later)  # a: 10 req/s x 0.1 s = 1 core
    demand = _obj(kube, "packratpools", "p")["status"]["models"]["a"]["demand"]
    assert (demand["rate"], demand["cores"]) == (10.0, 1.0)
    pools.reconcile(NS, "p", now=later + datetime.timedelta(seconds=1))  # placed with it
    status = _obj(kube, "packratpools", "p")["status"]
    assert "over capacity" in status["models"]["a"]["overCapacity"]
    assert "overCapacity" not in status["models"]["b"]  # 2 req/s: 0.2 cores fit
    assert status["models"]["a"]["pod"] == "p-0"  # hosted still, by memory
    Reconciler(kube, config=Config(image="img")).reconcile(NS, "a", now=later)
    placed = _condition(kube, "a", "Placed")
    assert placed["status"] == "False" and placed["reason"] == "OverCapacity"
    assert "1.00 cores" in placed["message"] and "0.80 usable" in placed["message"]


def test_a_plan_for_another_pool_or_shape_or_out_of_range_is_not_used(kube: FakeKube) -> None:
    _pool(kube, cpus=1)
    _model(kube)
    for bad in (
        {"pool": "q", "cpus": 1, "threads": 1, "batch": 1},
        {"pool": "p", "cpus": 2, "threads": 1, "batch": 1},
        {"pool": "p", "cpus": 1, "threads": 2, "batch": 1},
        {"pool": "p", "cpus": 1, "threads": True, "batch": 1},
        {"pool": "p", "cpus": 1, "threads": 1, "batch": 0},
    ):
        kube.patch_status("packratmodels", NS, "a", {"status": {"poolPlan": bad}})
        (member,) = members("p", [_obj(kube, "packratmodels", "a")], cpus=1)
        assert member.plan is None, bad
    weird = {"pool": "p", "cpus": 1, "threads": 1, "batch": 1, "batch1LatencyMs": float("nan")}
    kube.patch_status("packratmodels", NS, "a", {"status": {"poolPlan": weird}})
    (member,) = members("p", [_obj(kube, "packratmodels", "a")], cpus=1)
    assert member.plan is not None and member.plan.batch1_ms is None
