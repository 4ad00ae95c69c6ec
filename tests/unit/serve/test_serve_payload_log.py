"""Request and response logging at the dispatcher (issue 28): off by default; on, every sampled
prediction the model answered reaches the sink (JSON lines, or CloudEvents decoded here by the
``cloudevents`` SDK, in binary and structured mode) with both bodies, capped; a sink that hangs
or refuses never slows or fails a prediction: its records are dropped (queue full) or failed,
and counted."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from dispatcher_support import payload_log_count, run, serve_post, stack, until

from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.payload_log import (
    REQUEST_TYPE,
    RESPONSE_TYPE,
    PayloadLogConfig,
    PayloadLogError,
    PayloadLogger,
)

ce_http = pytest.importorskip("cloudevents.core.bindings.http")
ce_json = pytest.importorskip("cloudevents.core.formats.json")


class Sink:
    """A CloudEvents sink: records what arrives; ``gate`` holds answers; ``status`` answers."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.status = 202

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.raw.append((headers, body))
        message = ce_http.HTTPMessage(headers=headers, body=body)
        self.events.append(ce_http.from_http(message, ce_json.JSONFormat()))
        await self.gate.wait()
        return web.Response(status=self.status)


def _logger(sink: str, metrics: ServeMetrics, **kwargs: Any) -> PayloadLogger:
    return PayloadLogger(
        # the sinks here listen on loopback, which a sink may reach only when allowed
        PayloadLogConfig(sink=sink, egress_allow=("127.0.0.0/8",), **kwargs),
        model="m",
        registry=metrics.registry,
    )


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_cloudevents_carry_both_bodies(mode: str) -> None:
    async def main() -> None:
        sink = Sink()
        runner, url = await serve_post("/events", sink.handle)
        metrics = ServeMetrics()
        logger = _logger(f"{url}/events", metrics, mode=mode, source="/ns/resnet")
        try:
            async with stack([1], metrics=metrics, payload_log=logger) as (d, _, front, session):
                d.set_up(0, True)
                body = json.dumps({"x": [1, 2, 3]}).encode()
                headers = {"Content-Type": "application/json", "X-Request-Id": "req-1"}
                async with session.post(f"{front}/predictions/m", data=body, headers=headers) as r:
                    assert r.status == 200
                    answer = await r.read()
                await until(lambda: len(sink.events) == 2, "both events at the sink")
                await until(lambda: payload_log_count(metrics, "logged") == 1, "one record logged")
        finally:
            await runner.cleanup()
        request, response = sink.events
        assert request.get_type() == REQUEST_TYPE and response.get_type() == RESPONSE_TYPE
        assert request.get_id() == response.get_id() == "req-1"
        assert request.get_source() == "/ns/resnet" and request.get_extension("model") == "m"
        assert response.get_extension("status") == "200"
        if mode == "binary":
            assert request.get_data() == {"x": [1, 2, 3]}  # the body as it was
            assert sink.raw[0][0]["ce-specversion"] == "1.0"
        else:
            assert sink.raw[0][0]["Content-Type"].startswith("application/cloudevents+json")
            assert request.get_data() == {"x": [1, 2, 3]}
        # the fake model answers the body reversed: not JSON, so it travels as it is
        data = response.get_data()
        assert (data.encode() if isinstance(data, str) else bytes(data)) == answer

    run(main)


def test_jsonl_sampled_and_bodies_capped(tmp_path: Path) -> None:
    async def main() -> None:
        metrics = ServeMetrics()
        logger = PayloadLogger(
            PayloadLogConfig(
                sink=f"jsonl:{tmp_path}/log/requests.jsonl", sample_rate=0.5, max_body_bytes=8
            ),
            model="m",
            registry=metrics.registry,
            rng=random.Random(7),
        )
        async with stack([2], metrics=metrics, payload_log=logger) as (d, _, front, session):
            d.set_up(0, True)
            for i in range(40):
                body = bytes([i]) * 20  # binary: base64, capped at 8 bytes
                async with session.post(f"{front}/predictions/m", data=body) as r:
                    assert r.status == 200
            await until(
                lambda: logger.queue.empty() and payload_log_count(metrics, "logged") > 0,
                "the queue drained, records logged",
            )
        # the dispatcher closed the logger: everything queued was written
        lines = (tmp_path / "log" / "requests.jsonl").read_text().splitlines()
        draws = random.Random(7)  # the same draws the logger made
        expected = sum(draws.random() < 0.5 for _ in range(40))
        assert len(lines) == expected == payload_log_count(metrics, "logged")
        assert 10 < expected < 30
        record = json.loads(lines[0])
        assert record["model"] == "m" and record["status"] == 200 and len(record["id"]) == 32
        assert record["request"]["bytes"] == 20 and record["request"]["truncated"] is True
        assert len(base64.b64decode(record["request"]["bodyBase64"])) == 8
        assert record["latencyMs"] >= 0

    run(main)


def test_a_hung_sink_never_holds_a_prediction() -> None:
    """The sink answers nothing: the queue (2 records) fills, later records are dropped and
    counted, and every prediction is still answered 200."""

    async def main() -> None:
        sink = Sink()
        sink.gate.clear()  # hold every POST
        runner, url = await serve_post("/", sink.handle)
        metrics = ServeMetrics()
        logger = _logger(url + "/", metrics, queue_size=2, concurrency=1, timeout_s=60)
        try:
            async with stack([4], metrics=metrics, payload_log=logger) as (d, _, front, session):
                d.set_up(0, True)
                statuses = []
                for _ in range(12):
                    async with session.post(f"{front}/predictions/m", data=b"abc") as r:
                        statuses.append(r.status)
                assert statuses == [200] * 12
                # one record in the worker's hands, two queued, nine dropped
                assert payload_log_count(metrics, "dropped") == 9
                assert logger.queue.qsize() == 2
                depth = metrics.registry.get_sample_value(
                    "packrat_payload_log_queue_depth", {"model": "m"}
                )
                assert depth == 2
                sink.gate.set()
        finally:
            await runner.cleanup()

    run(main)


def test_a_refusing_or_slow_sink_counts_failures() -> None:
    async def main() -> None:
        sink = Sink()
        sink.status = 500
        runner, url = await serve_post("/", sink.handle)
        metrics = ServeMetrics()
        logger = _logger(url + "/", metrics, timeout_s=0.2)
        try:
            async with stack([1], metrics=metrics, payload_log=logger) as (d, _, front, session):
                d.set_up(0, True)
                async with session.post(f"{front}/predictions/m", data=b"a") as r:
                    assert r.status == 200
                await until(lambda: payload_log_count(metrics, "failed") == 1, "one record failed")
                sink.status, sink.gate = 202, asyncio.Event()  # now it hangs past the deadline
                async with session.post(f"{front}/predictions/m", data=b"b") as r:
                    assert r.status == 200
                await until(lambda: payload_log_count(metrics, "failed") == 2, "two records failed")
                sink.gate.set()
        finally:
            await runner.cleanup()
        assert payload_log_count(metrics, "logged") == 0

    run(main)


def test_off_by_default() -> None:
    async def main() -> None:
        async with stack([1]) as (dispatcher, _, front, session):
            dispatcher.set_up(0, True)
            assert dispatcher.payload_log is None
            async with session.post(f"{front}/predictions/m", data=b"a") as r:
                assert r.status == 200
        names = {f.name for f in ServeMetrics().registry.collect()}
        assert not any("payload_log" in n for n in names)

    run(main)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sink": "s3://bucket"}, "expected jsonl:PATH"),
        ({"sink": "jsonl:"}, "needs a path"),
        ({"sink": "jsonl:-", "sample_rate": 0.0}, "sample rate"),
        ({"sink": "jsonl:-", "mode": "batched"}, "mode"),
        ({"sink": "jsonl:-", "queue_size": 0}, "queue size"),
        ({"sink": "jsonl:-", "timeout_s": 600}, "timeout"),
    ],
)
def test_bad_settings_are_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PayloadLogError, match=message):
        PayloadLogConfig(**kwargs)


def test_request_id_is_bounded() -> None:
    from packrat.serve.dispatcher.payload_log import request_id

    assert request_id({"X-Request-Id": "abc-1"}) == "abc-1"
    assert len(request_id({"X-Request-Id": "x" * 500})) == 32  # too long: a fresh one
    assert len(request_id({"X-Request-Id": "a b"})) == 32  # not a token
    assert len(request_id({})) == 32
