"""Issue 26: one model's hostile store holds only that model's pass, for at most its deadline;
every other model keeps reconciling meanwhile (before, a store that dripped or never answered
held a reconcile thread for 182 s, and eight such models stalled every reconcile)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hostile_support import Listener, drip
from kube_support import NS, T0, FakeKube, profile_json

from packrat.controller.core.context import Config
from packrat.controller.core.status import get_condition
from packrat.controller.core.storage import StorageLimits
from packrat.controller.model.reconcile import Reconciler
from packrat.runtime.egress import EgressPolicy


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _model(kube: FakeKube, name: str, model: dict[str, Any]) -> None:
    spec = {"model": model, "cpus": 2, "batchSize": 4, "profiling": {"maxBatch": 8}}
    body = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": name, "namespace": NS, "uid": f"u-{name}"},
        "spec": spec,
    }
    kube.create("packratmodels", NS, body)


def _status(kube: FakeKube, name: str) -> dict[str, Any]:
    obj = kube.get("packratmodels", NS, name)
    assert obj is not None
    return dict(obj.get("status") or {})


def test_a_hostile_store_holds_only_its_own_model(stop: threading.Event, kube: FakeKube) -> None:
    # a store that sends a valid answer a byte every 2 s: each read succeeds in time
    payload = b'HTTP/1.1 200 OK\r\nETag: "v"\r\nContent-Length: 0\r\n\r\n'
    store = Listener(drip(payload, 2.0, stop))
    _model(kube, "hostile", {"storageUri": f"{store.url}/m.pt", "format": "torchscript"})
    _model(kube, "healthy", {"zoo": "tiny"})
    storage = StorageLimits(policy=EgressPolicy.parse(["127.0.0.0/8"]))
    rec = Reconciler(kube, config=Config(image="img", storage=storage))
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            held = pool.submit(rec.reconcile, NS, "hostile", now=T0)
            # the healthy model goes from nothing to Ready while the hostile pass is held
            rec.reconcile(NS, "healthy", now=T0)
            kube.finish_job(ok=True, log=profile_json())
            rec.reconcile(NS, "healthy", now=T0)
            kube.make_ready("healthy-a")
            assert rec.reconcile(NS, "healthy", now=T0).phase == "Ready"
            assert not held.done()  # still dripping: the store has sent a few bytes
            stop.set()  # the store gives up: its pass ends within its own deadline
            result = held.result(timeout=60)
    finally:
        store.close()
    assert result.phase == "Failed"
    cond = get_condition(_status(kube, "hostile").get("conditions"), "ModelAvailable") or {}
    assert cond.get("reason") == "Unreachable"
    assert kube.of("deployments") == ["healthy-a"]
