"""Faults around what a model owns and what it is given, on the emulator with the real
operator: a Service that is someone else's, a profiling Job superseded by a spec change, a
profiling pod no node fits, inputs that bypass the CRD. None of these models ever serves,
so the module runs no model process (the profiling pods never start).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from harness import OperatorCluster, wait_for
from models import body

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GRACE_SECONDS = 3
SLOW = 180.0  # a deadline for anything that takes seconds on a quiet machine

SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "batchSize": 2,
    "profiling": {"maxBatch": 4, "threads": [1, 2], "backoffLimit": 0},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorCluster]:
    old = os.environ.get("PACKRAT_UNSCHEDULABLE_GRACE_SECONDS")
    os.environ["PACKRAT_UNSCHEDULABLE_GRACE_SECONDS"] = str(GRACE_SECONDS)
    try:
        cluster = OperatorCluster(tmp_path_factory.mktemp("faults-children"))
    finally:
        if old is None:
            os.environ.pop("PACKRAT_UNSCHEDULABLE_GRACE_SECONDS", None)
        else:
            os.environ["PACKRAT_UNSCHEDULABLE_GRACE_SECONDS"] = old
    try:
        yield cluster
    finally:
        print("\n--- operator log tail ---\n" + cluster.log_tail(40))
        cluster.close()


def _create(cluster: OperatorCluster, name: str, spec: dict[str, Any]) -> None:
    cluster.api.create("packratmodels", body(name, spec))


def _delete(cluster: OperatorCluster, name: str) -> None:
    cluster.api.delete("packratmodels", name)
    wait_for(
        lambda: cluster.api.get("packratmodels", name) is None, timeout=SLOW, what=f"{name} gone"
    )


def _events(cluster: OperatorCluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.events(reason)
        if (e.get("involvedObject") or {}).get("name") == name and e.get("type") == "Warning"
    ]


def _jobs(cluster: OperatorCluster, name: str) -> list[str]:
    return sorted(
        j["metadata"]["name"]
        for j in cluster.api.list("jobs", {"packrat.dev/model": name})
        if not j["metadata"].get("deletionTimestamp")
    )


def test_fault2_foreign_service_is_never_taken_over(cluster: OperatorCluster) -> None:
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "mine", "labels": {"team": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    cluster.api.create("services", theirs)
    _create(cluster, "mine", {**SPEC, "image": "registry.example/not-pulled:1"})
    wait_for(
        lambda: cluster.condition("mine", "OwnershipConflict").get("status") == "True",
        timeout=SLOW,
        what="OwnershipConflict condition",
    )
    # the Event is posted just after the status it goes with: wait for it too
    wait_for(
        lambda: _events(cluster, "mine", "OwnershipConflict"),
        timeout=120,
        what="the OwnershipConflict event",
    )
    ready = cluster.condition("mine", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "OwnershipConflict"
    svc = cluster.api.get("services", "mine")
    assert svc is not None
    assert svc["spec"]["selector"] == {"app": "web"}
    assert not svc["metadata"].get("ownerReferences")
    assert svc["metadata"]["labels"] == {"team": "web"}
    _delete(cluster, "mine")
    assert cluster.api.get("services", "mine") is not None  # still theirs
    cluster.api.delete("services", "mine")


def test_fault4_superseded_profiling_job_is_deleted(cluster: OperatorCluster) -> None:
    # an image no node can pull: the profiling pod stays Pending, the Job runs forever
    spec = {**SPEC, "image": "registry.example/not-pulled:1"}
    _create(cluster, "sup", spec)
    first = wait_for(lambda: _jobs(cluster, "sup"), timeout=SLOW, what="first profiling job")
    assert len(first) == 1
    # the pull error is reported while it runs, in the condition and an event
    wait_for(
        lambda: "ErrImagePull" in cluster.condition("sup", "Profiled").get("message", ""),
        timeout=SLOW,
        what="image pull error in the Profiled condition",
    )
    # the Event is posted just after the status it goes with: wait for it too
    wait_for(
        lambda: _events(cluster, "sup", "ProfilingStuck"),
        timeout=120,
        what="the ProfilingStuck event",
    )
    cluster.api.patch("packratmodels", "sup", {"spec": {"profiling": {"maxBatch": 2}}})
    seen: list[list[str]] = []

    def replaced() -> bool:
        jobs = _jobs(cluster, "sup")
        seen.append(jobs)
        return len(jobs) == 1 and jobs != first

    wait_for(replaced, timeout=SLOW, what="the new profiling job alone")
    assert all(len(jobs) <= 1 for jobs in seen[1:]), seen
    _delete(cluster, "sup")


def test_fault5_unschedulable_profiling_pod_fails_fast(cluster: OperatorCluster) -> None:
    _create(cluster, "big", {**SPEC, "memory": "2Ti"})  # fits no node
    wait_for(
        lambda: "Unschedulable" in cluster.condition("big", "Profiled").get("message", ""),
        timeout=SLOW,
        what="the scheduler's reason in the Profiled condition",
    )
    assert "Insufficient memory" in cluster.condition("big", "Profiled")["message"]
    # the scheduler's reason in an Event too: ProfilingStuck while in the grace period, or
    # (a pass that comes late on a loaded machine, after the grace) straight in
    # ProfilingFailed; posted just after the status it goes with, so wait for it
    wait_for(
        lambda: [
            e
            for reason in ("ProfilingStuck", "ProfilingFailed")
            for e in _events(cluster, "big", reason)
            if "Insufficient memory" in e["message"]
        ],
        timeout=120,
        what="an Event with the scheduler's reason",
    )
    # the attempt fails after the grace period, not after 3 x timeoutSeconds
    wait_for(
        lambda: [
            e for e in _events(cluster, "big", "ProfilingFailed") if "nschedulable" in e["message"]
        ],
        timeout=SLOW,
        what="the attempt failed as unschedulable",
    )
    _delete(cluster, "big")


@pytest.mark.parametrize(
    ("name", "spec", "needle"),
    [
        (
            "gain",
            {**SPEC, "batchSize": None, "autoBatch": {"max": 4, "minGain": "high"}},
            "minGain",
        ),
        ("nl", {**SPEC, "memory": "4Gi\n"}, "spec.memory"),
        ("types", {**SPEC, "profiling": ["not", "an", "object"]}, "spec.profiling"),
    ],
)
def test_fault9_inputs_bypassing_the_crd_become_invalid_spec(
    cluster: OperatorCluster, name: str, spec: dict[str, Any], needle: str
) -> None:
    spec = {k: v for k, v in spec.items() if v is not None}
    _create(cluster, name, spec)
    wait_for(
        lambda: cluster.status(name).get("phase") == "Failed",
        timeout=SLOW,
        what=f"{name} Failed (log: {cluster.log_tail(5)})",
    )
    ready = cluster.condition(name, "Ready")
    assert ready["reason"] == "InvalidSpec" and needle in ready["message"], ready
    # the Event is posted just after the status it goes with: wait for it too
    wait_for(
        lambda: _events(cluster, name, "InvalidSpec"),
        timeout=120,
        what="the InvalidSpec event",
    )
    for resource in ("jobs", "deployments", "services"):
        assert cluster.api.list(resource, {"app.kubernetes.io/instance": name}) == []
    assert cluster.operator.healthy()
    _delete(cluster, name)
