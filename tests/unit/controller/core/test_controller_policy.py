"""Issue 26, item 7: the platform's allow-lists for what a model author may choose (images,
service accounts, priority classes, Secrets read into the environment, storage hosts). A spec
outside them is refused with a condition and an event, nothing is created for it, and a model
already serving keeps its last good configuration."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kube_support import NS, T0, TINY_SPEC, FakeKube, add_model, profile_json, set_spec

from packrat.cli import main
from packrat.controller.core.context import Config
from packrat.controller.core.overrides import ModelPolicy, refused_by_policy
from packrat.controller.core.status import get_condition
from packrat.controller.core.storage import StorageLimits
from packrat.controller.model.reconcile import Reconciler
from packrat.runtime.egress import EgressPolicy

POLICY = ModelPolicy.parse(
    images=["registry.example.com/packrat/*", "docker.io/library/python"],
    service_accounts=["model-runner"],
    priority_classes=["serving"],
    env_secrets=["model-env"],
)
SPEC: dict[str, Any] = copy.deepcopy(TINY_SPEC)


def _env(secret: str) -> dict[str, Any]:
    return {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "t"}}}


@pytest.mark.parametrize(
    ("changes", "refused"),
    [
        ({}, None),
        ({"image": "registry.example.com/packrat/serve:1.2"}, None),
        ({"image": "docker.io/library/python:3.11@sha256:" + "a" * 64}, None),
        ({"image": "evil.example.org/miner:latest"}, "spec.image"),
        ({"image": "registry.example.com/other/x:1"}, "spec.image"),
        ({"pod": {"serviceAccountName": "model-runner", "env": [_env("model-env")]}}, None),
        ({"pod": {"serviceAccountName": "cluster-admin-sa"}}, "serviceAccountName"),
        ({"pod": {"priorityClassName": "batch-urgent"}}, "priorityClassName"),
        ({"pod": {"env": [_env("database-password")]}}, "database-password"),
        ({"model": {"storageUri": "https://models.example.com/m.pt"}}, None),
        ({"model": {"storageUri": "https://attacker.example.net/m.pt"}}, "storage host"),
    ],
)
def test_the_allow_lists(changes: dict[str, Any], refused: str | None) -> None:
    spec = {**SPEC, **changes}
    why = refused_by_policy(
        spec, POLICY, default_image="img", storage_hosts=("models.example.com",)
    )
    assert (refused is None) == (why == []), why
    if refused is not None:
        assert refused in why[0]
    # unset lists restrict nothing
    assert refused_by_policy(spec, ModelPolicy(), default_image="img") == []


def _reconciler(kube: FakeKube) -> Reconciler:
    storage = StorageLimits(policy=EgressPolicy.parse([], ["models.example.com"]))
    config = Config(image="img", profile_retry_seconds=10, policy=POLICY, storage=storage)
    return Reconciler(kube, config=config)


def _cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    return dict(get_condition(kube.prm()["status"].get("conditions"), type_) or {})


def test_a_refused_model_gets_nothing_and_a_serving_one_keeps_serving(kube: FakeKube) -> None:
    add_model(kube, {**SPEC, "pod": {"serviceAccountName": "cluster-admin-sa"}})
    rec = _reconciler(kube)
    res = rec.reconcile(NS, "tiny", now=T0)
    assert res.phase == "Failed"
    cond = _cond(kube, "Ready")
    assert cond["reason"] == "PolicyRefused" and "cluster-admin-sa" in cond["message"]
    assert ("Warning", "PolicyRefused") in [(k, r) for k, r, _ in res.events]
    assert kube.of("jobs") == [] and kube.of("deployments") == []
    # allowed now: profiled and served
    set_spec(kube, pod={"serviceAccountName": "model-runner"})
    rec.reconcile(NS, "tiny", now=T0)
    kube.finish_job(ok=True, log=profile_json())
    rec.reconcile(NS, "tiny", now=T0)
    kube.make_ready("tiny-a")
    assert rec.reconcile(NS, "tiny", now=T0).phase == "Ready"
    before = kube.get("deployments", NS, "tiny-a")
    # an edit outside the lists: refused, the serving slot untouched
    set_spec(kube, image="evil.example.org/miner:latest")
    res = rec.reconcile(NS, "tiny", now=T0)
    assert _cond(kube, "Ready")["reason"] == "PolicyRefused"
    assert kube.get("deployments", NS, "tiny-a") == before
    assert kube.of("deployments") == ["tiny-a"]


def test_bad_allow_list_flags_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["operator", "--namespace", "x", "--allow-image", "a*b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "a*b" in err[0]
