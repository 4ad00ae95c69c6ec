"""Issue 38: one v2 client must not stall a pod. The declared shapes are checked before any
data is flattened, a request carries at most the plan's batch, bodies are parsed off the event
loop in a bounded pool, the queue and the tuner's arrivals are charged by samples, and
malformed headers (non-ASCII ``Authorization``, a non-ASCII digit as the binary header's
length) are a 4xx, not a 500. A real dispatcher on a real port, in front of an in-process
backend that answers like the model service."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from dispatcher_support import GatedRows, _serve_runner
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher import v2 as v2_module
from packrat.serve.dispatcher import v2_codec
from packrat.serve.dispatcher.app import Dispatcher

TINY = modelid.zoo_input_spec("tiny")
TOKEN = "s3cret-token"


@asynccontextmanager
async def pod(
    batches: list[int], **kwargs: Any
) -> AsyncIterator[tuple[Dispatcher, GatedRows, str, aiohttp.ClientSession]]:
    instances = [
        InstanceSpec(index=i, name=f"tiny_i{i}", threads=1, batch=b, cpus=(i,))
        for i, b in enumerate(batches)
    ]
    backend = GatedRows()
    d = Dispatcher(model="tiny", instances=instances, backend=backend, admin_token=TOKEN, **kwargs)
    d.inputs = TINY
    for i in range(len(instances)):
        d.set_up(i, True)
    runner, url = await _serve_runner(d.runner())
    try:
        async with aiohttp.ClientSession() as session:
            yield d, backend, url, session
    finally:
        backend.gate.set()
        await runner.cleanup()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def request(n: int, *, shape: list[int] | None = None, data: Any = None) -> bytes:
    rows = [[float(i + j) for j in range(16)] for i in range(n)]
    tensor = {
        "name": "input__0",
        "datatype": "FP32",
        "shape": shape if shape is not None else [n, 16],
        "data": rows if data is None else data,
    }
    return json.dumps({"inputs": [tensor]}).encode()


async def infer(s: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, Any]:
    async with s.post(f"{url}/v2/models/tiny/infer", data=body) as r:
        return r.status, await r.json()


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_request_carries_at_most_the_plans_batch() -> None:
    async def go() -> None:
        async with pod([2, 2]) as (d, _, url, s):
            assert d.max_samples == 4
            status, doc = await infer(s, url, request(4))
            assert status == 200 and doc["outputs"][0]["shape"] == [4, 1]
            status, doc = await infer(s, url, request(5))
            assert status == 400 and "1..4 samples" in doc["error"], doc

    run(go())


def test_declared_shapes_are_checked_before_any_data_is_flattened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flattened: list[str] = []
    real = v2_codec._flatten

    def spy(data: Any, name: str) -> list[Any]:
        flattened.append(name)
        return real(data, name)

    monkeypatch.setattr(v2_codec, "_flatten", spy)
    big = [[0.0] * 16] * 3  # its data would be flattened: 3 rows the model could take
    for doc in (
        {"shape": [3, 17], "data": big},  # not the model's sample shape
        {"shape": [1000, 16], "data": big},  # beyond the plan's batch
    ):
        tensor = {"name": "input__0", "datatype": "FP32", **doc}
        body = json.dumps({"inputs": [tensor]}).encode()
        with pytest.raises(v2_codec.V2Error):
            v2_codec.parse_request(body, None, TINY, max_samples=8)
    bad_type = json.dumps(
        {"inputs": [{"name": "input__0", "datatype": "INT64", "shape": [3, 16], "data": big}]}
    ).encode()
    with pytest.raises(v2_codec.V2Error, match="datatype"):
        v2_codec.parse_request(bad_type, None, TINY, max_samples=8)
    assert flattened == []


def test_a_v2_body_is_capped_at_the_plans_samples_of_one_sample_each() -> None:
    async def go() -> None:
        async with pod([2]) as (d, _, url, s):
            d.max_body_bytes = 4096  # what the pod sets: one sample's worth
            body = request(2)
            assert len(body) < 2 * 4096
            assert (await infer(s, url, body))[0] == 200
            padded = body[:-1] + b" " * (2 * 4096) + b"}"  # under the old 6 MiB ceiling
            async with s.post(f"{url}/v2/models/tiny/infer", data=padded) as r:
                assert r.status == 413
                assert "error" in await r.json()

    run(go())


def test_parsing_runs_off_the_event_loop_and_its_line_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a body is being parsed, readiness and health still answer; beyond the pool's
    line a request is shed at once (503, Retry-After), not queued behind the parses."""
    release = threading.Event()
    entered = threading.Event()
    real = v2_module.parse_request

    def slow(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(15)  # a parse that takes as long as the test wants
        return real(*args, **kwargs)

    monkeypatch.setattr(v2_module, "parse_request", slow)

    async def go() -> None:
        async with pod([4]) as (d, _, url, s):
            d.parser.inline_bytes = 0  # these small bodies stand for large ones
            first = asyncio.create_task(infer(s, url, request(1)))
            await until(entered.is_set)
            timeout = aiohttp.ClientTimeout(total=5)
            async with s.get(f"{url}/ping", timeout=timeout) as r:
                assert r.status == 200
            async with s.get(f"{url}/v2/health/ready", timeout=timeout) as r:
                assert r.status == 200
            line = [asyncio.create_task(infer(s, url, request(1))) for _ in range(8)]
            await until(lambda: d.parser.pending == d.parser.limit)
            async with s.post(f"{url}/v2/models/tiny/infer", data=request(1), timeout=timeout) as r:
                assert r.status == 503 and r.headers["Retry-After"]
                assert "parsed" in (await r.json())["error"]
            release.set()
            answers = await asyncio.gather(first, *line)
            assert [status for status, _ in answers] == [200] * 9

    try:
        run(go())
    finally:
        release.set()


def test_the_queue_and_the_arrivals_are_charged_by_samples() -> None:
    """Each sample takes a place in the queue, and is one arrival for the tuner."""

    async def go() -> None:
        async with pod([2], queue_limit=3) as (d, backend, url, s):
            backend.gate.clear()  # the instance holds what it took (cap: 2 batches of 2)
            held = [asyncio.create_task(s.post(f"{url}/predictions/tiny", data=b"\0" * 64))
                    for _ in range(4)]  # fmt: skip
            await until(lambda: d.slots.in_flight == 4)
            before = d.arrivals.total
            two = asyncio.create_task(infer(s, url, request(2)))
            await until(lambda: d.slots.queued == 2)
            # 2 more samples need 2 places; 1 is left: refused whole, at once
            async with asyncio.timeout(10):
                status, doc = await infer(s, url, request(2))
            assert status == 503 and "queue" in doc["error"], doc
            assert d.slots.queued == 2
            backend.gate.set()
            for task in held:
                (await task).release()
            status, doc = await two
            assert status == 200 and doc["outputs"][0]["shape"] == [2, 1]
            assert d.arrivals.total - before == 2  # two samples, two arrivals

    run(go())


async def raw(url: str, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request written byte for byte (clients refuse non-ASCII headers)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


NON_ASCII = [b"Bearer \xc3\xa9t\xc3\xa9", b"Bearer \xe9\xff\x80", "²".encode()]


@pytest.mark.parametrize("value", NON_ASCII)
def test_a_non_ascii_authorization_is_a_401(value: bytes) -> None:
    async def go() -> None:
        async with pod([1]) as (_, _, url, _s):
            for method, path, body in (
                (b"GET", b"/arrivals", b""),
                (b"POST", b"/admin/canary", b'{"percent": 0}'),
            ):
                head = method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: "
                status, _ = await raw(url, head + value + b"\r\n", body)
                assert status == 401, (path, status)

    run(go())


@pytest.mark.parametrize("value", ["²", "٣", "1²", "+5", "1_0"])
def test_a_binary_header_length_that_is_no_ascii_number_is_a_400(value: str) -> None:
    async def go() -> None:
        async with pod([1]) as (_, _, url, _s):
            head = (
                b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\n"
                b"Inference-Header-Content-Length: " + value.encode() + b"\r\n"
            )
            status, body = await raw(url, head, request(1))
            assert status == 400, status
            assert "Inference-Header-Content-Length" in json.loads(body)["error"]

    run(go())


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(st.sampled_from(["input__0", "input__1", "x"]), min_size=1, max_size=2),
    dtype=st.sampled_from(["FP32", "INT64", "FP64", "BYTES"]),
    batch=st.integers(0, 10),
    tail=st.lists(st.integers(0, 17), min_size=0, max_size=2),
)
def test_checking_the_declaration_first_refuses_exactly_what_splitting_refuses(
    names: list[str], dtype: str, batch: int, tail: list[int]
) -> None:
    """The early check (before any data is read) agrees with the full parse and split."""
    shape = [batch, *tail]
    count = 1
    for d in shape:
        count *= d
    data: list[Any] = ["a"] * count if dtype == "BYTES" else [1] * count
    doc = {"inputs": [{"name": n, "datatype": dtype, "shape": shape, "data": data} for n in names]}
    body = json.dumps(doc).encode()

    def verdict(early: bool) -> bool:
        try:
            if early:
                req = v2_codec.parse_request(body, None, TINY, max_samples=8)
            else:
                req = v2_codec.parse_request(body, None)
            v2_codec.split_samples(req, TINY, max_samples=8)
        except v2_codec.V2Error:
            return False
        return True

    assert verdict(True) == verdict(False)
