"""Canary rollout end to end (issue 28): the real operator (kopf subprocess) against the kmock
emulator, real ``packrat serve`` pods of the tiny model for the stable slot and the canary, and
closed-loop load through the model's Service proxy for the whole test.

1. ``spec.canary`` at 30%: the canary Deployment and Service come up, the stable pod is told
   the split, and of the predictions made after that, the share the canary answered (the
   ``X-Packrat-Canary`` header) is within 5 points of 30%.
2. Promote by editing the spec (``spec.model`` := the canary's model, ``spec.canary`` removed):
   a plan switch to the other slot serves the new model; the canary is removed afterwards.
3. A canary with a P99 threshold it cannot meet is rolled back by the operator itself
   (``CanaryRolledBack``, ``status.canary.phase: RolledBack``, its pods deleted).
4. Roll back by editing the spec (``spec.canary`` removed): the canary's pods go, every
   prediction is the stable pod's again.

No request fails anywhere (the load's failures are asserted empty at the end). The "new
versions" are the tiny zoo model under spec variants (an explicit name, a sample content type)
that serve the same ``/predictions/canary`` path: a real rollout changes ``uri`` or
``storageUri``; the operator treats any change of the model source alike. The model gets a
hand-written profile (the test is about the rollout, not profiling). Waits poll conditions with
deadlines sized for a loaded 2-core machine; nothing is timed.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from harness import ClientThreads, OperatorCluster, wait_for
from models import body, tiny_spec, wait_ready
from seeding import seed_profile

from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

NAME = "canary"
SPEC: dict[str, Any] = tiny_spec(
    2, cpus=1, threads=(1,), precision=None, budget_s=None, batchSize=1
)
# the canaries: new sources of the same served model (see the module docstring)
V2 = {"zoo": "tiny", "name": NAME}
V3 = {"zoo": "tiny", "name": NAME, "sampleContentType": "application/x-v3"}
V4 = {"zoo": "tiny", "name": NAME, "sampleContentType": "application/x-v4"}
PERCENT = 30
SLOW = 420.0  # a pod start, or a switch, on a loaded machine


def _profile() -> Profile:
    points = (ProfilePoint(1, 1, 1.0), ProfilePoint(1, 2, 1.8))
    meta = ProfileMeta(
        model="tiny",
        cpu_model="Test CPU",
        cpus=1,
        extra={"grid": {"threads": [1], "batches": [1, 2]}, "complete": True},
    )
    return Profile(meta=meta, points=points)


@dataclass
class CanaryLoad(ClientThreads):
    """Closed-loop load through the Service proxy recording, per request, when it started,
    its status and whether the canary answered it."""

    pause_s: ClassVar[float] = 0.005
    join_s: ClassVar[float] = 60.0
    thread_name: ClassVar[str] = "canary-load"

    cluster: OperatorCluster
    clients: int = 2
    records: list[tuple[float, int, bool]] = field(default_factory=list)
    failures: list[tuple[float, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self) -> None:
        start = time.monotonic()
        request = urllib.request.Request(
            f"{self.cluster.agent.proxy.url(NAME)}/predictions/{NAME}",
            data=json.dumps([0.1] * 16).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
                canary = resp.headers.get("X-Packrat-Canary") == "true"
                self.records.append((start, resp.status, canary))
        except urllib.error.HTTPError as exc:
            self.records.append((start, exc.code, False))
            self.failures.append((start, exc.code, exc.read().decode(errors="replace")[:200]))
        except (urllib.error.URLError, OSError) as exc:
            self.records.append((start, 0, False))
            self.failures.append((start, 0, str(exc)[:200]))

    def after(self, t: float) -> list[tuple[float, int, bool]]:
        return [r for r in list(self.records) if r[0] >= t]


def _detail(cluster: OperatorCluster) -> str:
    return f"status: {cluster.status(NAME)}\nlog:\n{cluster.log_tail(15)}"


def _canary_state(cluster: OperatorCluster) -> dict[str, Any]:
    state: dict[str, Any] = cluster.status(NAME).get("canary") or {}
    return state


def _patch_spec(cluster: OperatorCluster, spec: dict[str, Any]) -> None:
    cluster.api.patch("packratmodels", NAME, {"spec": spec})


def _gone(cluster: OperatorCluster) -> bool:
    return (
        cluster.api.get("deployments", f"{NAME}-canary") is None
        and cluster.api.get("services", f"{NAME}-canary") is None
        and not cluster.agent.running(f"{NAME}-canary")
    )


def _progressing(cluster: OperatorCluster, hash_of: dict[str, Any] | None = None) -> bool:
    state = _canary_state(cluster)
    return state.get("phase") == "Progressing" and (
        hash_of is None or state.get("model") == hash_of
    )


def test_canary_split_promote_and_rollbacks_without_a_failed_request(
    cluster: OperatorCluster,
) -> None:
    cluster.api.create("packratmodels", body(NAME, SPEC))
    seed_profile(cluster, NAME, _profile())
    wait_ready(cluster, NAME, detail=lambda: _detail(cluster))
    first_slot = cluster.status(NAME)["activeSlot"]
    with CanaryLoad(cluster) as load:
        wait_for(lambda: len(load.records) > 20, timeout=SLOW, what="load warm-up")

        # 1. a canary at 30%: the measured split
        _patch_spec(cluster, {"canary": {"model": V2, "trafficPercent": PERCENT}})
        wait_for(
            lambda: _progressing(cluster, V2),
            timeout=SLOW,
            what="the canary taking its share",
            period=0.25,
            detail=lambda: _detail(cluster),
        )
        told = time.monotonic()
        wait_for(lambda: len(load.after(told)) >= 400, timeout=SLOW, what="400 predictions")
        window = load.after(told)[:400]
        share = 100.0 * sum(1 for _, _, canary in window if canary) / len(window)
        print(f"canary share over {len(window)} predictions: {share:.1f}% (asked {PERCENT}%)")
        assert abs(share - PERCENT) <= 5, share
        assert cluster.api.get("services", f"{NAME}-canary") is not None
        wait_for(
            lambda: _canary_state(cluster).get("requests", 0) >= 50,
            timeout=SLOW,
            what="the stable pod's canary counts in status",
        )
        state = _canary_state(cluster)
        assert state["errors"] == 0 and state["trafficPercent"] == PERCENT, state

        # 2. promote by editing the spec: the canary's model becomes the model
        _patch_spec(cluster, {"model": V2, "canary": None})
        wait_for(
            lambda: (
                (s := cluster.status(NAME)).get("phase") == "Ready"
                and s.get("activeSlot") != first_slot
                and (s.get("servingSpec") or {}).get("model") == V2
                and "canary" not in s
                and _gone(cluster)
            ),
            timeout=2 * SLOW,
            what="the promoted model serving from the other slot, the canary gone",
            period=0.25,
            detail=lambda: _detail(cluster),
        )
        promoted = time.monotonic()
        assert cluster.status(NAME)["lastSwitch"]["result"] == "Succeeded"
        wait_for(lambda: len(load.after(promoted)) >= 50, timeout=SLOW, what="predictions")
        assert not any(canary for _, _, canary in load.after(promoted))

        # 3. a canary that cannot meet its P99 threshold is rolled back by the operator
        _patch_spec(
            cluster,
            {
                "canary": {
                    "model": V3,
                    "trafficPercent": 50,
                    "rollback": {"maxP99Ms": 0.001, "minRequests": 5},
                }
            },
        )
        wait_for(
            lambda: _canary_state(cluster).get("phase") == "RolledBack" and _gone(cluster),
            timeout=SLOW,
            what="the automatic rollback",
            period=0.25,
            detail=lambda: _detail(cluster),
        )
        state = _canary_state(cluster)
        assert "P99" in state["message"] and state["trafficPercent"] == 0, state
        # a pass posts its Events after its status: the rollback can be seen before its Event
        wait_for(lambda: cluster.events("CanaryRolledBack"), timeout=60, what="the Event")
        rolled = time.monotonic()
        wait_for(lambda: len(load.after(rolled)) >= 50, timeout=SLOW, what="predictions")
        assert not any(canary for _, _, canary in load.after(rolled))
        assert _canary_state(cluster).get("phase") == "RolledBack"  # stays rolled back

        # 4. a new canary, rolled back by editing the spec
        # (a merge patch: the thresholds of step 3 must be removed explicitly)
        _patch_spec(cluster, {"canary": {"model": V4, "trafficPercent": 40, "rollback": None}})
        wait_for(
            lambda: _progressing(cluster, V4),
            timeout=SLOW,
            what="the next canary taking its share",
            period=0.25,
            detail=lambda: _detail(cluster),
        )
        taking = time.monotonic()
        wait_for(
            lambda: sum(1 for _, _, c in load.after(taking) if c) >= 20,
            timeout=SLOW,
            what="predictions the canary answered",
        )
        _patch_spec(cluster, {"canary": None})
        wait_for(
            lambda: "canary" not in cluster.status(NAME) and _gone(cluster),
            timeout=SLOW,
            what="the canary removed",
            period=0.25,
            detail=lambda: _detail(cluster),
        )
        removed = time.monotonic()
        wait_for(lambda: len(load.after(removed)) >= 50, timeout=SLOW, what="predictions")
        assert not any(canary for _, _, canary in load.after(removed))
    print(f"{len(load.records)} predictions through split, promote and rollbacks")
    assert load.failures == [], load.failures[:5]
    wait_for(
        lambda: cluster.events("CanaryRemoved") and cluster.events("CanaryStarted"),
        timeout=60,
        what="the canary's Events",
    )
