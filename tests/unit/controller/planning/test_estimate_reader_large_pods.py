"""Issue 38: a pod with many instances answers a /status larger than the estimate reader used
to accept (64 instances: 9,179 B against an 8 KiB cap), and autoBatch silently got nothing.
The reader's cap now holds the /status of the largest pod the operator plans (one instance per
core, 256 cores), served here by a real dispatcher's /status route."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dispatcher_support import _serve_runner

from packrat.controller.core.fanout import PodFanout
from packrat.controller.planning.estimates import EstimateReader
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher

CORES = 256


def _status_doc(instances: list[InstanceSpec]) -> dict[str, Any]:
    """What the pod adds to /status: one entry per instance, with its health."""
    return {
        "model": "m",
        "cpus": list(range(CORES)),
        "instances": [
            {**i.to_dict(), "up": True, "restarts": 0, "status": "READY"} for i in instances
        ],
    }


@pytest.fixture()
def big_pod() -> Iterator[str]:
    instances = [
        InstanceSpec(index=i, name=f"model_i{i}", threads=1, batch=1, cpus=(i,))
        for i in range(CORES)
    ]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    where: list[str] = []

    async def start() -> None:
        d = Dispatcher(
            model="model",
            instances=instances,
            backend_url="http://127.0.0.1:9",
            status=lambda: _status_doc(instances),
        )
        _, url = await _serve_runner(d.runner())
        where.append(url)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert ready.wait(30)
    try:
        yield where[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_a_256_instance_pods_status_is_read(big_pod: str) -> None:
    fanout = PodFanout()
    try:
        reader = EstimateReader(
            None,  # type: ignore[arg-type]  # no API server: the Service path is read
            pod_url="http://{ip}",
            service_url=big_pod,
            fanout=fanout,
        )
        reading = reader._read_all("ns/model", [big_pod])
        assert len(reading) == 1 and reading[0].estimate >= 1
    finally:
        fanout.close()
