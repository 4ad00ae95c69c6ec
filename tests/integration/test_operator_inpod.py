"""The in-pod plan switch end to end (issue 14, item 4): the real operator (kopf subprocess)
against the kmock emulator, real ``packrat serve`` pods of the tiny model (the test agent
plays the kubelet: it resolves the plan ConfigMap and the admin token Secret into the pod's
environment when a container starts), closed-loop load through the Service proxy.

1. A batch-only change (same cores) is switched inside the running pod: the operator updates
   the slot's plan ConfigMap and posts the plan to the pod (``POST /admin/plan``, bearer token
   from the model's Secret). No new Deployment, no new pod, no template change: the same pod
   process serves the new plan, and no request fails.
2. A cores change still takes the active-passive Deployment switch (slot b, new pods), with no
   failed request either.

The model gets a hand-written profile (the test is about switching, not profiling), so its
plans are known: batch 2 -> 2x1t/b1, batch 4 -> 2x1t/b2 (two 1-thread instances, each with a
larger batch), and on 1 cpu batch 2 -> 1x1t/b2. No timing assertions; every wait polls a
condition with a deadline sized for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from harness import Load, OperatorCluster, wait_for
from models import body, tiny_spec, wait_ready
from seeding import seed_profile

from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

INPOD_SWITCH = True  # conftest: this module's operator switches in the pods (its default)

NAME = "inpod"
SPEC: dict[str, Any] = tiny_spec(4, precision=None, budget_s=None, batchSize=2)
SLOW = 180.0  # a deadline for anything that takes seconds on a quiet machine
SWITCH_S = SLOW + SPEC["switch"]["readyTimeoutSeconds"]

# mean batch latency (ms) by (threads, batch): 2 x 1 thread always beats 1 x 2 threads
LATENCY = {(1, 1): 1.0, (1, 2): 1.8, (1, 4): 3.5, (2, 1): 0.8, (2, 2): 1.2, (2, 4): 2.2}


def _profile(cpus: int) -> Profile:
    threads = [t for t in (1, 2) if t <= cpus]
    points = tuple(
        ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in LATENCY.items() if t <= cpus
    )
    meta = ProfileMeta(
        model="tiny",
        cpu_model="Test CPU",
        cpus=cpus,
        extra={"grid": {"threads": threads, "batches": [1, 2, 4]}, "complete": True},
    )
    return Profile(meta=meta, points=points)


def _pod_status(cluster: OperatorCluster, pod: str) -> dict[str, Any]:
    url = f"{cluster.agent.proxy.pod_url(pod)}/status"
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _plan_cm(cluster: OperatorCluster, slot: str) -> dict[str, Any]:
    cm = cluster.api.get("configmaps", f"{NAME}-{slot}-plan")
    assert cm is not None
    doc: dict[str, Any] = json.loads(cm["data"]["plan.json"])
    return doc


def _detail(cluster: OperatorCluster) -> str:
    return f"status: {cluster.status(NAME)}\nlog:\n{cluster.log_tail(15)}"


def _await_switch(
    cluster: OperatorCluster, load: Load, done: Callable[[], Any], *, what: str
) -> tuple[Any, float]:
    """Wait for ``done`` (the switch's end), then for 20 requests served after it; ``done``'s
    value and when it came."""
    result = wait_for(
        done, timeout=SWITCH_S, what=what, period=0.25, detail=lambda: _detail(cluster)
    )
    switched_at = time.monotonic()
    wait_for(
        lambda: sum(1 for t, _ in load.results if t > switched_at) > 20,
        timeout=SLOW,
        what="requests served after the switch",
    )
    return result, switched_at


def test_batch_change_switches_in_the_pod_and_cores_change_switches_slots(
    cluster: OperatorCluster,
) -> None:
    cluster.api.create("packratmodels", body(NAME, SPEC))
    seed_profile(cluster, NAME, _profile(2))
    wait_ready(cluster, NAME, detail=lambda: _detail(cluster))
    status = cluster.status(NAME)
    assert status["activeSlot"] == "a" and status["plan"]["batch"] == 2
    secret = cluster.api.get("secrets", f"{NAME}-admin-token")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["name"] == NAME
    (pod,) = cluster.agent.running(f"{NAME}-a")
    assert pod.proc is not None
    pid = pod.proc.pid
    dep_before = cluster.api.get("deployments", f"{NAME}-a")
    assert dep_before is not None
    assert _pod_status(cluster, pod.name)["plan"]["batch"] == 2

    # 1. batch 2 -> 4 on the same 2 cores: in the pod, under load
    with Load(cluster, NAME, NAME, clients=2) as load:
        wait_for(lambda: len(load.results) > 20, timeout=SLOW, what="load warm-up")
        cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": 4}})
        switched, _ = _await_switch(
            cluster,
            load,
            lambda: (
                (last := cluster.status(NAME).get("lastSwitch") or {}).get("mode") == "InPod"
                and last
            ),
            what="the in-pod switch",
        )
    status = cluster.status(NAME)
    print("in-pod switch:", switched)
    assert switched["result"] == "Succeeded" and switched["fromSlot"] == switched["toSlot"] == "a"
    assert status["plan"]["batch"] == 4 and status["activeSlot"] == "a"
    assert "switch" not in status and status["phase"] == "Ready"
    # the same pod process serves the new plan; no new Deployment, no template change
    assert [p.name for p in cluster.agent.running(f"{NAME}-a")] == [pod.name]
    assert pod.proc.poll() is None and pod.proc.pid == pid
    assert cluster.api.get("deployments", f"{NAME}-b") is None
    dep_after = cluster.api.get("deployments", f"{NAME}-a")
    assert dep_after is not None
    assert dep_after["spec"]["template"] == dep_before["spec"]["template"]
    assert dep_after["metadata"].get("generation") == dep_before["metadata"].get("generation")
    served = _pod_status(cluster, pod.name)["plan"]
    assert served["batch"] == 4, served
    assert _plan_cm(cluster, "a")["batch"] == 4  # a restarted pod starts on it
    assert load.failures == [], load.failures[:5]
    assert not cluster.events("InPodSwitchFailed")

    # 1b. the admin token rotates (its time made due) while the pod still holds the old token
    # files (the agent, like a slow kubelet, never updates them): the operator calls with the
    # previous token, which the pod holds, so batch 4 -> 2 still switches in the pod
    old_token = secret["data"]["token"]
    stale = {"packrat.dev/admin-token-rotated-at": "2020-01-01T00:00:00Z"}
    cluster.api.patch("secrets", f"{NAME}-admin-token", {"metadata": {"annotations": stale}})
    with Load(cluster, NAME, NAME, clients=2) as load:
        wait_for(lambda: len(load.results) > 20, timeout=SLOW, what="load warm-up")
        cluster.api.patch("packratmodels", NAME, {"spec": {"batchSize": 2}})
        _await_switch(
            cluster,
            load,
            lambda: (cluster.status(NAME).get("plan") or {}).get("batch") == 2,
            what="the in-pod switch after a rotation",
        )
    rotated = cluster.api.get("secrets", f"{NAME}-admin-token")
    assert rotated is not None and rotated["data"]["previous"] == old_token
    assert rotated["data"]["token"] != old_token
    assert cluster.status(NAME)["lastSwitch"]["mode"] == "InPod"
    assert pod.proc.poll() is None and pod.proc.pid == pid  # the same pod, its old files
    assert _pod_status(cluster, pod.name)["plan"]["batch"] == 2
    assert load.failures == [], load.failures[:5]
    assert not cluster.events("InPodSwitchFailed")

    # 2. 2 cpus -> 1: the pod template changes, so the Deployment switch (slot b)
    key = status["profile"]["key"]
    with Load(cluster, NAME, NAME, clients=2) as load:
        wait_for(lambda: len(load.results) > 20, timeout=SLOW, what="load warm-up")
        cluster.api.patch(
            "packratmodels",
            NAME,
            {"spec": {"cpus": 1, "batchSize": 2, "profiling": {"threads": [1]}}},
        )
        wait_for(
            lambda: (cluster.status(NAME).get("profile") or {}).get("key") not in (None, key),
            timeout=SLOW,
            what="the 1-cpu profile key",
        )
        seed_profile(cluster, NAME, _profile(1))
        _, switched_at = _await_switch(
            cluster,
            load,
            lambda: (
                (cluster.status(NAME).get("lastSwitch") or {}).get("mode") == "Deployment"
                and "switch" not in cluster.status(NAME)
            ),
            what="the Deployment switch to 1 cpu",
        )
    status = cluster.status(NAME)
    print("deployment switch:", status["lastSwitch"])
    assert status["lastSwitch"]["result"] == "Succeeded" and status["activeSlot"] == "b"
    assert status["plan"]["cpus"] == 1 and status["plan"]["batch"] == 2
    assert _plan_cm(cluster, "b")["cpus"] == 1
    (new_pod,) = cluster.agent.running(f"{NAME}-b")
    assert new_pod.name != pod.name and _pod_status(cluster, new_pod.name)["plan"]["cpus"] == 1
    if load.failures:
        t0 = load.results[0][0]
        print(
            "switched at",
            switched_at - t0,
            "terminations",
            [(t - t0, n) for t, n, _ in cluster.agent.terminations],
        )
        print("failures from", load.failures[0][0] - t0, "to", load.failures[-1][0] - t0)
        print("ok after", [t - t0 for t, c in load.results if c == 200][-3:])
    assert load.failures == [], load.failures[:5]
