"""A PackratPool's pods as an unfriendly cluster runs them: what a pod answers on
``/pool/status`` never fails the pool's pass, and how long it takes to answer holds the pass
for at most one deadline, however many of the pool's pods are slow."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hostile_support import Listener, answer
from kube_support import FakeKube

from packrat.controller.core.fanout import Answer, PodFanout, _Call
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.pool import manifests as pm
from packrat.controller.pool import readings
from packrat.controller.pool.readings import Hosted, PoolReader, parse_status
from packrat.controller.pool.reconcile import PoolReconciler

NS = "ns"
GOOD = {"resident_bytes": 1, "file_bytes": 2, "requests": 3, "cold_starts": 1,
        "read_bytes": 5, "last_use": 1.7e9}  # fmt: skip


def _pod(pool: str, key: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{key}-x", "namespace": NS, "labels": pm.pod_labels(pool, key)},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class TableFanout(PodFanout):
    """The operator's pod client answering every URL with one document (``by_ip``: another
    for the pod of that address), at once."""

    def __init__(self, doc: Any, by_ip: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.doc, self.by_ip = doc, by_ip or {}

    def _doc(self, url: str) -> Any:
        return next((d for ip, d in self.by_ip.items() if f"//{ip}:" in url), self.doc)

    def _start(self, call: _Call, urls: Sequence[str]) -> concurrent.futures.Future[list[Answer]]:
        done: concurrent.futures.Future[list[Answer]] = concurrent.futures.Future()
        done.set_result([Answer(200, json.dumps(self._doc(u)).encode()) for u in urls])
        return done


class MappedFanout(PodFanout):
    """The real pod client, each pod's address mapped to a loopback listener."""

    def __init__(self, to: dict[str, str]) -> None:
        super().__init__()
        self.to = to

    def _start(self, call: _Call, urls: Sequence[str]) -> concurrent.futures.Future[list[Answer]]:
        mapped = [self._target(url) for url in urls]
        return super()._start(call, mapped)

    def _target(self, url: str) -> str:
        for ip, target in self.to.items():
            if url.startswith(f"http://{ip}:8080/"):
                return target + url.removeprefix(f"http://{ip}:8080")
        return url


@pytest.mark.parametrize("last_use", [1e20, 10**25, 253_402_300_800])
def test_a_last_use_no_date_can_name_is_dropped_and_the_pass_goes_on(
    kube: FakeKube, last_use: float
) -> None:
    """A pod reporting ``last_use`` past year 9999 made every pass of its pool raise
    (OverflowError writing it as a date): no model of the pool was ever placed ready."""
    assert parse_status("p-0", {"models": {"a": {**GOOD, "last_use": last_use}}}, {"a"}) == {}
    spec = {"weightBudget": "64Mi", "memory": "1Gi", "replicas": 1}
    kube.create("packratpools", NS, {"metadata": {"name": "p", "namespace": NS}, "spec": spec})
    for name in ("a", "b"):
        model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
        kube.create("packratmodels", NS, {"metadata": {"name": name}, "spec": model})
    kube.create("pods", NS, _pod("p", "p-0", "10.0.0.1"))
    doc = {"models": {"a": {**GOOD, "last_use": last_use}, "b": GOOD}}
    fanout = TableFanout(doc)
    try:
        reader = PoolReader(kube, pod_url="http://{ip}:8080", fanout=fanout)
        PoolReconciler(kube, reader=reader).reconcile(NS, "p")
    finally:
        fanout.close()
    models = ((kube.get("packratpools", NS, "p") or {}).get("status") or {})["models"]
    assert models["a"]["ready"] is False and "lastUse" not in models["a"]
    assert models["b"]["ready"] is True and models["b"]["lastUse"].startswith("2023-")


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_every_pool_pod_is_read_at_once_under_one_deadline(
    kube: FakeKube, stop: threading.Event
) -> None:
    """Each pod answers only once all three have been asked: a reader that asks them one
    after the other (as it did: a pass waited a deadline per slow pod, 64 pods x 2 s) reads
    at most one of them; one that asks them all at once, under one deadline, reads all."""
    # past the first request's deadline, before the third could be asked one by one
    everyone = threading.Barrier(3, timeout=readings.DEADLINE_SECONDS * 1.25)
    body = json.dumps({"models": {"a": GOOD}}).encode()
    ok = answer("200 OK", {"Content-Type": "application/json", "Content-Length": str(len(body))})

    def when_all_asked(conn: Any, head: bytes) -> None:
        try:
            everyone.wait()
        except threading.BrokenBarrierError:
            return
        ok(conn, head)
        conn.sendall(body)

    listeners = [Listener(when_all_asked) for _ in range(3)]
    keys = [f"p-{i}" for i in range(3)]
    for i, key in enumerate(keys):
        kube.create("pods", NS, _pod("p", key, f"10.0.0.{i + 1}"))
    fanout = MappedFanout({f"10.0.0.{i + 1}": lst.url for i, lst in enumerate(listeners)})
    try:
        reader = PoolReader(kube, pod_url="http://{ip}:8080", fanout=fanout)
        got = reader(NS, "p", {key: {"a"} for key in keys}, token="t")
    finally:
        stop.set()
        fanout.close()
        for lst in listeners:
            lst.close()
    assert {key: sorted(hosted) for key, hosted in got.items()} == {k: ["a"] for k in keys}
    assert all(b"Authorization: Bearer t" in lst.heads[0] for lst in listeners)


def test_a_digest_that_never_matches_keeps_the_service_and_says_why(kube: FakeKube) -> None:
    """A pod that lists the model but never under the config written last: the model's
    Service never moves there, and its Ready condition says which pod and why (it said
    "waiting for pool p to serve it", as if the pod had not started)."""
    spec = {"weightBudget": "64Mi", "memory": "1Gi", "replicas": 1}
    kube.create("packratpools", NS, {"metadata": {"name": "p", "namespace": NS}, "spec": spec})
    model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
    kube.create("packratmodels", NS, {"metadata": {"name": "a", "namespace": NS}, "spec": model})

    def never_current(namespace: str, pool: str, expected: Any, *, token: Any = None) -> Any:
        return {pod: {n: Hosted(pod, 1, 2, 3, 1, 0.0, "0" * 64) for n in names}
                for pod, names in expected.items()}  # fmt: skip

    for _ in range(3):
        PoolReconciler(kube, reader=never_current).reconcile(NS, "p")
        Reconciler(kube).reconcile(NS, "a")
    assert kube.get("services", NS, "a") is None
    status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "PoolConfigPending"
    assert "pod p-0 lists it under another config" in ready["message"]


def test_a_model_whose_pool_pod_stops_answering_is_not_ready_until_it_answers_again(
    kube: FakeKube,
) -> None:
    """The pool pod serving a model stops answering (OOMKilled, blackholed, or it drops the
    model from its /pool/status): the model said Ready ("served by pool p pod p-0"), phase
    Ready, for as long as it lasted. Now Ready False naming the pod, its Service kept there;
    Ready again once the pod answers. A pool deleted says what to do."""
    spec = {"weightBudget": "64Mi", "memory": "1Gi", "replicas": 1}
    kube.create("packratpools", NS, {"metadata": {"name": "p", "namespace": NS}, "spec": spec})
    model = {"model": {"zoo": "tiny"}, "cpus": 1, "batchSize": 1, "pool": "p"}
    kube.create("packratmodels", NS, {"metadata": {"name": "a", "namespace": NS}, "spec": model})
    answering = [True]

    def reader(namespace: str, pool: str, expected: Any, *, token: Any = None) -> Any:
        digest = pm.config_digest(kube.get("configmaps", NS, "p-0") or {})
        return {pod: {n: Hosted(pod, 1, 2, 3, 1, 0.0, digest) for n in names}
                for pod, names in expected.items() if answering[0]}  # fmt: skip

    def ready() -> tuple[str, dict[str, Any]]:
        for _ in range(2):
            PoolReconciler(kube, reader=reader).reconcile(NS, "p")
            Reconciler(kube).reconcile(NS, "a")
        status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
        return status["phase"], {c["type"]: c for c in status["conditions"]}["Ready"]

    assert ready()[0] == "Ready"
    answering[0] = False
    phase, cond = ready()
    assert phase == "Deploying" and cond["status"] == "False"
    assert cond["reason"] == "PoolPodNotReady" and "pod p-0" in cond["message"]
    assert pm.pod_of_service(kube.get("services", NS, "a")) == "p-0"
    answering[0] = True
    assert ready()[0] == "Ready"
    kube.delete("packratpools", NS, "p")
    Reconciler(kube).reconcile(NS, "a")
    status = (kube.get("packratmodels", NS, "a") or {}).get("status") or {}
    gone = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert gone["reason"] == "NotPlaced" and "remove spec.pool" in gone["message"]


def test_pods_of_pool_pods_never_asked_do_not_crowd_out_the_asked_ones(kube: FakeKube) -> None:
    """64 ready pods labelled as a pool pod the pool did not ask (a leftover, or anyone's
    pods with the pool's labels), listed first: the reader cut the list at 64 before
    looking at which pool pod each was, and never read ``p-0``."""
    for i in range(64):
        kube.create("pods", NS, _pod("p", f"p-{i + 1}", f"10.0.1.{i}"))
    kube.create("pods", NS, _pod("p", "p-0", "10.0.0.1"))
    fanout = TableFanout({"models": {"a": GOOD}})
    try:
        reader = PoolReader(kube, pod_url="http://{ip}:8080", fanout=fanout)
        got = reader(NS, "p", {"p-0": {"a"}}, token="t")
    finally:
        fanout.close()
    assert list(got) == ["p-0"] and list(got["p-0"]) == ["a"]


def test_a_config_is_current_only_when_every_ready_replica_serves_it(kube: FakeKube) -> None:
    """Two ready replicas of pool pod ``p-0`` (a rollout) both list the model, one under the
    config written last and one under an older one (which may drop the model a moment
    later): the digest was the last replica's, so the model's Service could move while the
    other replica was about to 404 it. Now the digest counts only when they agree."""
    digest = "d" * 64
    kube.create("pods", NS, _pod("p", "p-0", "10.0.0.1"))
    second = _pod("p", "p-0", "10.0.0.2")
    second["metadata"]["name"] = "p-0-y"
    kube.create("pods", NS, second)
    new = {"models": {"a": GOOD}, "config_digest": digest}
    old = {"models": {"a": GOOD}, "config_digest": "0" * 64}
    for stale in ({"10.0.0.1": old}, {"10.0.0.2": old}, {}):
        fanout = TableFanout(new, by_ip=stale)
        try:
            reader = PoolReader(kube, pod_url="http://{ip}:8080", fanout=fanout)
            got = reader(NS, "p", {"p-0": {"a"}}, token="t")["p-0"]["a"]
        finally:
            fanout.close()
        assert got.config == ("" if stale else digest)
