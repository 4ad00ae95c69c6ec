"""Issue 38: the request log cannot grow the pod past its memory budget, and its sink obeys an
egress policy. A hung sink holds at most ``max_queue_bytes`` of records, charged to the
dispatcher's buffer budget (given back once delivered); a sink on loopback, link-local (the
metadata service) or behind a hiding authority is refused, by its literal address at once and
by every address its name resolves to at connection time. Real dispatcher, real sink."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web
from dispatcher_support import payload_log_count, run, serve_post, stack, until

from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogError, PayloadLogger

MiB = 1024 * 1024


class Sink:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.got = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.got += 1
        await self.gate.wait()
        return web.Response(status=202)


def test_a_hung_sink_holds_a_bounded_number_of_bytes_inside_the_budget() -> None:
    async def main() -> None:
        sink = Sink()
        runner, url = await serve_post("/", sink.handle)
        metrics = ServeMetrics()
        config = PayloadLogConfig(
            sink=url + "/",
            queue_size=100_000,
            max_body_bytes=MiB,
            max_queue_bytes=4 * MiB,
            concurrency=1,
            timeout_s=60,
            egress_allow=("127.0.0.0/8",),
        )
        logger = PayloadLogger(config, model="m", registry=metrics.registry)
        try:
            async with stack([4], metrics=metrics, payload_log=logger) as (d, _, front, session):
                d.set_up(0, True)
                for _ in range(20):
                    async with session.post(f"{front}/predictions/m", data=b"x" * MiB) as r:
                        assert r.status == 200
                await until(lambda: sink.got >= 1, "a record at the sink")
                assert logger.queue.qsize() <= 4 and payload_log_count(metrics, "dropped") >= 15
                held = d.budget.used
                assert 0 < held <= 4 * MiB + 64 * 1024  # the records, inside the pod's budget
                sink.gate.set()
                await until(
                    lambda: logger.queue.qsize() == 0 and d.budget.used == 0,
                    "the queue drained, the budget given back",
                )
        finally:
            sink.gate.set()
            await runner.cleanup()

    run(main)


@pytest.mark.parametrize(
    "sink",
    [
        "http://127.0.0.1:9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:9/",
        "http://[::ffff:127.0.0.1]:9/",
        "http://0.0.0.0:9/",
        "http://localhost:9/",
        "http://LocalHost.:9/",
        "http://broker.example.com?@127.0.0.1/",
        "http://user@broker.example.com/",
    ],
)
def test_an_internal_or_hiding_sink_is_refused(sink: str) -> None:
    with pytest.raises(PayloadLogError):
        PayloadLogConfig(sink=sink)


def test_in_cluster_sinks_stay_allowed() -> None:
    PayloadLogConfig(sink="http://10.96.0.12/")  # a Service address: a Knative broker
    PayloadLogConfig(sink="http://broker-ingress.knative-eventing.svc.cluster.local/ns/default")
    PayloadLogConfig(sink="http://127.0.0.1:9/", egress_allow=("127.0.0.0/8",))


def test_a_name_resolving_to_loopback_gets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name whose DNS answer is loopback (here: a stand-in resolver's answer)."""
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "sink.example.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)

    async def main() -> None:
        sink = Sink()
        sink.gate.set()
        runner, url = await serve_post("/", sink.handle)
        metrics = ServeMetrics()
        port = url.rsplit(":", 1)[1]
        config = PayloadLogConfig(sink=f"http://sink.example.test:{port}/", concurrency=1)
        logger = PayloadLogger(config, model="m", registry=metrics.registry)
        try:
            async with stack([4], metrics=metrics, payload_log=logger) as (d, _, front, session):
                d.set_up(0, True)
                for _ in range(3):
                    async with session.post(f"{front}/predictions/m", data=b"abc") as r:
                        assert r.status == 200
                await until(
                    lambda: payload_log_count(metrics, "failed") == 3, "three records failed"
                )
                assert sink.got == 0
        finally:
            await runner.cleanup()

    run(main)
