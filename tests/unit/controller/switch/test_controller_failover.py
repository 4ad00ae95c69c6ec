"""Serving Deployments deleted under the model (issue 9, fault 1), on the in-memory API that
honours finalizers as the API server does: each decision of the pass about a deleted slot."""

from __future__ import annotations

import datetime
import json
from typing import Any

from kube_support import NS, T0, FakeKube, ModelSetUp, ready_model, set_spec

from packrat.controller.core.model import model_spec
from packrat.controller.core.spec import DEFAULT_IMAGE
from packrat.controller.core.status import get_condition
from packrat.controller.core.wakeups import Wakeups
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.serving import manifests as m
from packrat.controller.serving import protection

FIN = "packrat.dev/serving"


def _dep(kube: FakeKube, name: str) -> dict[str, Any]:
    dep = kube.get("deployments", NS, name)
    assert dep is not None, name
    return dep


def _memory(kube: FakeKube, name: str) -> str:
    containers = _dep(kube, name)["spec"]["template"]["spec"]["containers"]
    return str(containers[0]["resources"]["limits"]["memory"])


def _selected(kube: FakeKube) -> str:
    svc = kube.get("services", NS, "tiny")
    assert svc is not None
    return str(svc["spec"]["selector"]["packrat.dev/slot"])


def _cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    return dict(get_condition(kube.prm()["status"].get("conditions"), type_) or {})


def _renders(kube: FakeKube, slot: str, status: dict[str, Any]) -> bool:
    """The slot's Deployment and plan ConfigMap are rendered from ``status``'s served spec
    and plan (the pod template's hash has the plan's cores, the ConfigMap the plan)."""
    spec, plan = status["servingSpec"], status["plan"]
    want = model_spec(spec, image=spec.get("image") or DEFAULT_IMAGE).template_hash(plan["cpus"])
    label = _dep(kube, f"tiny-{slot}")["metadata"]["labels"]["packrat.dev/serving-hash"]
    cm = kube.get("configmaps", NS, f"tiny-{slot}-plan")
    assert cm is not None
    return label == want and json.loads(cm["data"]["plan.json"])["batch"] == plan["batch"]


def _failing_switch() -> tuple[FakeKube, Reconciler, str]:
    """A served model (slot a) whose switch to a spec that fits no node is under way."""
    kube, rec = ready_model()
    good = kube.prm()["status"]["servingHash"]
    set_spec(kube, batchSize=8, memory="2Ti")
    rec.reconcile(NS, "tiny", now=T0)
    assert kube.prm()["status"]["switch"]["stage"] == "rollout"
    assert _memory(kube, "tiny-b") == "2Ti"
    return kube, rec, good


def test_serving_deployments_carry_the_finalizer(served_model: ModelSetUp) -> None:
    kube, _ = served_model
    assert _dep(kube, "tiny-a")["metadata"]["finalizers"] == [FIN]


def test_a_deployment_made_without_the_finalizer_gets_it(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    kube.objects[("deployments", NS, "tiny-a")]["metadata"]["finalizers"] = ["other.io/x"]
    kube.objects[("deployments", NS, "tiny-a")]["metadata"]["resourceVersion"] = "7"
    rec.reconcile(NS, "tiny", now=T0)
    assert _dep(kube, "tiny-a")["metadata"]["finalizers"] == ["other.io/x", FIN]
    # written only if nobody changed the object since it was read (resourceVersion)
    (patch,) = [p for r, n, p in kube.patches if n == "tiny-a"]
    assert patch["metadata"]["resourceVersion"] == "7"


def test_active_deleted_during_a_failing_switch_keeps_serving_then_fails_over() -> None:
    kube, rec, good = _failing_switch()
    kube.delete("deployments", NS, "tiny-a")  # background (kubectl's default)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    # the deleted Deployment is held: its pods keep serving, the Service still selects them
    assert protection.terminating(_dep(kube, "tiny-a")) and protection.protected(
        _dep(kube, "tiny-a")
    )
    assert _selected(kube) == "a" and status["activeSlot"] == "a"
    # the failing switch is aborted, and the other slot gets the LAST GOOD configuration
    assert res.switch_result == "aborted" and status["lastSwitch"]["result"] == "Aborted"
    assert _memory(kube, "tiny-b") == "4Gi"
    assert _renders(kube, "b", kube.prm()["status"])
    assert _dep(kube, "tiny-b")["spec"]["replicas"] == 1
    assert res.phase == "Reconfiguring" and res.waiting
    assert _cond(kube, "Reconfiguring")["reason"] == "ActiveDeploymentDeleted"
    assert ("Warning", "ActiveDeploymentDeleted") in [(k, r) for k, r, _ in res.events]
    # not ready yet: nothing moves, nothing is let go (and the Warning is not repeated)
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=30))
    assert _selected(kube) == "a" and protection.protected(_dep(kube, "tiny-a"))
    assert ("Warning", "ActiveDeploymentDeleted") not in [(k, r) for k, r, _ in res.events]
    # ready: the Service moves, and only then is the deleted one let go (and gone)
    kube.make_ready("tiny-b")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=31))
    assert _selected(kube) == "b"
    assert kube.of("deployments") == ["tiny-b"]
    assert ("Normal", "FailedOver") in [(k, r) for k, r, _ in res.events]
    status = kube.prm()["status"]
    assert status["activeSlot"] == "b" and status["servingHash"] == good
    assert status["servingSpec"]["memory"] == "4Gi" and res.phase == "Ready"
    # at rest on the last good configuration: the failed spec is not tried again
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=400))
    assert res.phase == "Ready" and res.switch_result is None
    assert kube.of("deployments") == ["tiny-b"] and _selected(kube) == "b"


def test_the_held_deployment_is_never_patched() -> None:
    kube, rec, _ = _failing_switch()
    kube.delete("deployments", NS, "tiny-a")
    before = _dep(kube, "tiny-a")
    n = len(kube.patches)
    for seconds in (1, 2, 500):  # past the ready timeout: nothing scales it or re-renders it
        rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=seconds))
    assert not [p for r, name, p in kube.patches[n:] if name == "tiny-a"]
    assert _dep(kube, "tiny-a") == before


def test_active_deleted_while_draining_completes_the_switch_and_fails_over(
    served_model: ModelSetUp,
) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)
    kube.make_ready("tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    status = kube.prm()["status"]
    assert status["switch"]["stage"] == "draining" and status["activeSlot"] == "b"
    new_hash = status["servingHash"]
    kube.delete("deployments", NS, "tiny-b")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))
    status = kube.prm()["status"]
    assert res.switch_result == "succeeded" and "switch" not in status
    assert _selected(kube) == "b"  # the new plan's pods, held, keep serving
    # the old slot now renders the new (last good) plan, and its pods (same template but
    # the plan) are replaced: the plan's hash is in their template
    assert _renders(kube, "a", status) and status["servingHash"] == new_hash
    annotations = _dep(kube, "tiny-a")["spec"]["template"]["metadata"]["annotations"]
    assert annotations[m.ANNOTATION_PLAN_HASH]
    kube.make_ready("tiny-a")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=3))
    assert _selected(kube) == "a" and kube.of("deployments") == ["tiny-a"]
    assert kube.prm()["status"]["plan"]["batch"] == 8


def test_active_deleted_in_the_foreground_is_recreated_at_once() -> None:
    kube, rec, good = _failing_switch()
    kube.delete("deployments", NS, "tiny-a", propagation="Foreground")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    # its pods are being deleted: nothing to protect, our finalizer goes at once
    assert _dep(kube, "tiny-a")["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert res.switch_result == "aborted"
    assert _cond(kube, "Ready")["reason"] == "ActiveDeploymentDeleted"
    assert res.phase != "Ready" and res.waiting
    kube.collect("tiny-a")  # the garbage collector deleted the pods: the Deployment goes
    assert "tiny-a" not in kube.of("deployments")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))
    assert _memory(kube, "tiny-a") == "4Gi"
    assert _renders(kube, "a", kube.prm()["status"])
    assert _selected(kube) == "a"
    kube.make_ready("tiny-a")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=3))
    assert res.phase == "Ready" and kube.prm()["status"]["servingHash"] == good


def test_active_deleted_without_the_finalizer_is_recreated_once_gone(
    served_model: ModelSetUp,
) -> None:
    kube, rec = served_model
    kube.objects[("deployments", NS, "tiny-a")]["metadata"]["finalizers"] = ["other.io/x"]
    kube.delete("deployments", NS, "tiny-a")
    rec.reconcile(NS, "tiny", now=T0)  # not held by us: left to go, never re-protected
    assert _dep(kube, "tiny-a")["metadata"]["finalizers"] == ["other.io/x"]
    assert "tiny-b" not in kube.of("deployments")
    kube.patch("deployments", NS, "tiny-a", {"metadata": {"finalizers": []}})
    rec.reconcile(NS, "tiny", now=T0)
    assert _dep(kube, "tiny-a")["metadata"]["finalizers"] == [FIN]


def test_a_deleted_passive_slot_is_let_go_at_once(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)  # the switch renders slot b
    kube.delete("deployments", NS, "tiny-b")
    res = rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    assert "tiny-b" not in kube.of("deployments")  # let go, so gone
    assert _selected(kube) == "a" and res.phase == "Reconfiguring"
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))  # the switch goes on
    assert _dep(kube, "tiny-b")["metadata"]["finalizers"] == [FIN]


def test_both_slots_deleted_the_passive_goes_first_then_takes_over() -> None:
    kube, rec, good = _failing_switch()
    kube.delete("deployments", NS, "tiny-a")
    kube.delete("deployments", NS, "tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=1))
    # b let go and gone; a held and serving
    assert protection.protected(_dep(kube, "tiny-a")) and _selected(kube) == "a"
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=2))
    assert _memory(kube, "tiny-b") == "4Gi" and not protection.terminating(_dep(kube, "tiny-b"))
    kube.make_ready("tiny-b")
    rec.reconcile(NS, "tiny", now=T0 + datetime.timedelta(seconds=3))
    assert _selected(kube) == "b" and kube.of("deployments") == ["tiny-b"]
    assert kube.prm()["status"]["servingHash"] == good


def test_selector_replacement_lets_the_old_object_go(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    dep = kube.objects[("deployments", NS, "tiny-a")]
    dep["spec"]["selector"] = {"matchLabels": {"old": "x"}}
    rec.reconcile(NS, "tiny", now=T0)
    new = _dep(kube, "tiny-a")
    assert new["spec"]["selector"]["matchLabels"]["packrat.dev/slot"] == "a"
    assert not protection.terminating(new) and protection.protected(new)


def test_a_model_being_deleted_lets_every_deployment_go(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    set_spec(kube, batchSize=8)
    rec.reconcile(NS, "tiny", now=T0)
    kube.objects[("packratmodels", NS, "tiny")]["metadata"]["deletionTimestamp"] = "now"
    assert rec.reconcile(NS, "tiny", now=T0).result == "gone"
    for name in ("tiny-a", "tiny-b"):
        assert not protection.protected(_dep(kube, name))
    # the garbage collector's delete, once the model is gone, then completes at once
    kube.delete("packratmodels", NS, "tiny")
    kube.delete("deployments", NS, "tiny-a")
    assert "tiny-a" not in kube.of("deployments")


def test_a_gone_model_lets_its_held_deployments_go(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    kube.delete("packratmodels", NS, "tiny")
    kube.delete("deployments", NS, "tiny-a")  # the garbage collector's delete
    assert protection.terminating(_dep(kube, "tiny-a"))
    assert rec.reconcile(NS, "tiny", now=T0).result == "gone"
    assert kube.of("deployments") == []


def test_release_orphans_spares_what_a_live_model_owns(served_model: ModelSetUp) -> None:
    kube, rec = served_model
    leftover = _dep(kube, "tiny-a")
    leftover["metadata"]["name"] = "tiny-x"
    leftover["metadata"]["ownerReferences"][0]["uid"] = "old-uid"
    kube.create("deployments", NS, leftover)
    assert rec.release_orphans(NS, "tiny") == ["tiny-x"]
    assert protection.protected(_dep(kube, "tiny-a"))
    # the model being deleted: nothing is spared
    kube.objects[("packratmodels", NS, "tiny")]["metadata"]["deletionTimestamp"] = "now"
    assert rec.release_orphans(NS, "tiny") == ["tiny-a"]


def test_protect_patch_and_finalizer_builders() -> None:
    dep = {"metadata": {"name": "d", "finalizers": ["x"], "resourceVersion": "5"}}
    assert protection.protect_patch(dep) == {
        "metadata": {"finalizers": ["x", FIN], "resourceVersion": "5"}
    }
    assert protection.protect_patch({"metadata": {"finalizers": [FIN]}}) is None
    deleting = {"metadata": {"deletionTimestamp": "t", "finalizers": ["x"]}}
    assert protection.protect_patch(deleting) is None  # refused by the API server
    assert protection.pods_going(
        {"metadata": {"deletionTimestamp": "t", "finalizers": [FIN, "foregroundDeletion"]}}
    )
    assert m.FINALIZER_SERVING == FIN


def test_handlers_sweep_only_held_deleted_deployments_without_a_daemon() -> None:
    wakeups = Wakeups()
    assert wakeups.wake("ns/gone") is False
    wakeups.get("ns/live")
    assert wakeups.wake("ns/live") is True
    held = {"deletionTimestamp": "t", "finalizers": [FIN]}
    assert protection.held(held, "MODIFIED") and protection.held(held, None)
    assert not protection.held(held, "DELETED")
    assert not protection.held({"finalizers": [FIN]}, "MODIFIED")  # not deleted: nothing to let go
    assert not protection.held({"deletionTimestamp": "t", "finalizers": ["x"]}, "MODIFIED")
    meta = {"uid": "u", "resourceVersion": "3"}
    assert wakeups.changed(meta, None) and not wakeups.changed(meta, None)
    wakeups.forget(meta)  # the release it triggered failed: the next listing tries again
    assert wakeups.changed(meta, None)
