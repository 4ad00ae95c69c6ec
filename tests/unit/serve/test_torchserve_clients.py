"""TorchServe's and KServe v1's clients at the dispatcher (issue 37): ``curl -T`` (a PUT),
multipart forms split into fields as TorchServe's frontend splits them (the worker's request
path, :func:`packrat.runtime.mar.form_fields`), and ``/v1/models/{m}:predict``."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.runtime.mar import form_fields, request_parameters, request_row
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher


def encoded(fields: list[tuple[str, str, bytes]]) -> tuple[bytes, str]:
    """A form as aiohttp's client encodes it (a real multipart writer)."""
    form = aiohttp.FormData()
    for name, ctype, data in fields:
        form.add_field(name, data, content_type=ctype, filename=f"{name}.bin")
    payload = form()
    out: list[bytes] = []

    class Sink:
        async def write(self, chunk: bytes) -> None:
            out.append(bytes(chunk))

    asyncio.run(payload.write(Sink()))  # type: ignore[arg-type]
    return b"".join(out), str(payload.content_type)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["data", "meta", "x"]), st.binary(max_size=300)),
        min_size=1,
        max_size=4,
    )
)
def test_a_form_splits_into_its_fields_byte_for_byte(parts: list[tuple[str, bytes]]) -> None:
    fields = [(name, "application/octet-stream", data) for name, data in parts]
    body, ctype = encoded(fields)
    assert form_fields(body, ctype) == fields


def test_fields_are_decoded_as_torchserve_decodes_them_and_others_stay_whole() -> None:
    body, ctype = encoded([("data", "image/jpeg", b"\xff\xd8\r\n--x"),
                           ("meta", "application/json", b'{"k": 1}')])  # fmt: skip
    assert request_row(body, ctype) == {"data": b"\xff\xd8\r\n--x", "meta": {"k": 1}}
    assert request_parameters(b"[1, 2]", "application/json") == [
        {"name": "body", "contentType": "application/json", "value": [1, 2]}
    ]
    broken = body[: len(body) // 2]  # no closing delimiter: the handler gets it whole
    assert request_row(broken, ctype) == {"body": broken}
    assert form_fields(body, "multipart/form-data") is None  # no boundary


class Echo:
    """Answers each sample with what arrived: its content type and length (or the JSON)."""

    kind = "fake"

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        self.seen.append((headers.get("Content-Type", ""), body))
        if body.startswith(b"[-"):
            return web.json_response({"code": 400, "message": "negative"}, status=400)
        return web.Response(body=b"[" + str(len(body)).encode() + b"]")


@asynccontextmanager
async def pod() -> AsyncIterator[tuple[Dispatcher, Echo, str, aiohttp.ClientSession]]:
    echo = Echo()
    instances = [InstanceSpec(index=0, name="m_i0", threads=1, batch=4, cpus=(0,))]
    d = Dispatcher(model="m", instances=instances, backend=echo)
    d.set_up(0, True)
    runner = d.runner()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as s:
            yield d, echo, f"http://{host}:{port}", s
    finally:
        await runner.cleanup()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def test_a_put_is_served_as_torchserve_serves_it() -> None:
    async def go() -> None:
        async with pod() as (d, echo, url, s):
            data = array("f", [1.0] * 16).tobytes()
            async with s.put(f"{url}/predictions/m", data=data) as r:
                assert r.status == 200 and await r.read() == b"[64]"
            assert echo.seen[-1][1] == data and d.arrivals.total == 1

    run(go())


def test_kserve_v1_predict_takes_instances_and_answers_predictions() -> None:
    async def go() -> None:
        async with pod() as (d, echo, url, s):
            doc = {"instances": [[1.0, 2.0], [3.5]]}
            async with s.post(f"{url}/v1/models/m:predict", json=doc) as r:
                assert r.status == 200
                assert await r.json() == {"predictions": [[9], [5]]}
            assert [b for _, b in echo.seen] == [b"[1.0,2.0]", b"[3.5]"]
            assert {t for t, _ in echo.seen} == {"application/json"}
            assert d.arrivals.total == 2
            for bad, status in (
                ({"instances": []}, 400),
                ({"inputs": [1]}, 400),
                ({"instances": [[0]] * 5}, 400),  # beyond the plan's batch of 4
                ({"instances": [[-1]]}, 400),  # the model's own 400
            ):
                async with s.post(f"{url}/v1/models/m:predict", json=bad) as r:
                    assert r.status == status and "error" in await r.json(), bad
            async with s.post(f"{url}/v1/models/other:predict", json=doc) as r:
                assert r.status == 404 and "error" in await r.json()

    run(go())


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_a_form_reaches_the_backend_whole_with_its_content_type(method: str) -> None:
    """The dispatcher passes a form through (TorchServe's frontend, or the native worker's
    request path, splits it): same bytes, same boundary."""

    async def go() -> None:
        async with pod() as (_, echo, url, s):
            form = aiohttp.FormData()
            form.add_field("data", b"\x00\x01", filename="img.jpg", content_type="image/jpeg")
            async with s.request(method, f"{url}/predictions/m", data=form) as r:
                assert r.status == 200
            ctype, body = echo.seen[-1]
            assert form_fields(body, ctype) == [("data", "image/jpeg", b"\x00\x01")]

    run(go())
