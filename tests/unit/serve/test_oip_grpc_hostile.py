"""The gRPC port against a hostile client (issue 38, the new surfaces): infer calls opened
and never sent (their headers only) are counted by gRPC's concurrency limit before their
message arrives. One client holding them took the port from every other client, for as long
as it liked; now a client holds at most its share, and a call without its message ends after
the receive deadline."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from dispatcher_support import GatedRows

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.oip.grpc_server import GrpcFront
from packrat.serve.dispatcher.oip.messages import SERVICE, message

RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


def one_sample() -> Any:
    req = message("ModelInferRequest")(model_name="tiny")
    req.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.append(b"\0" * 64)
    return req


async def infer(target: str) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        rpc = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message("ModelInferResponse").FromString,
        )
        return await rpc(one_sample(), timeout=10)


async def never_sent() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()  # the call's headers go out, its message never does
    yield b""


def silent_calls(channel: grpc.aio.Channel, n: int) -> list[Any]:
    rpc = channel.stream_unary(f"/{SERVICE}/ModelInfer")
    return [rpc(never_sent()) for _ in range(n)]


async def codes(calls: list[Any]) -> list[grpc.StatusCode]:
    out = []
    for c in calls:
        try:
            await c
        except grpc.aio.AioRpcError as exc:
            out.append(exc.code())
    return out


async def dispatcher() -> Dispatcher:
    instances = [InstanceSpec(index=0, name="tiny_i0", threads=1, batch=4, cpus=(0,))]
    d = Dispatcher(model="tiny", instances=instances, backend=GatedRows())
    d.inputs = modelid.zoo_input_spec("tiny")
    d.set_up(0, True)
    return d


def test_client_of_reads_the_address_without_the_port() -> None:
    from packrat.serve.dispatcher.oip.grpc_server import client_of

    assert client_of("ipv4:10.0.0.7:5123") == "10.0.0.7"
    assert client_of("ipv6:%5B::1%5D:5123") == "[::1]"
    assert client_of("ipv6:[fe80::1]:80") == "[fe80::1]"
    assert client_of("unix:/tmp/s") == "/tmp/s"


def test_one_client_holds_its_share_of_calls_and_a_silent_call_ends_at_the_deadline() -> None:
    async def go() -> None:
        d = await dispatcher()
        front = GrpcFront(d)
        port = await front.start("127.0.0.1", 0, max_rpcs=8, receive_timeout_s=1.0)
        target = f"127.0.0.1:{port}"
        try:
            assert front.max_per_client == 2  # a quarter of the calls, as REST's share
            async with grpc.aio.insecure_channel(target) as channel:
                calls = silent_calls(channel, 3)
                done, _ = await asyncio.wait(
                    [asyncio.ensure_future(c) for c in calls], timeout=0.9,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                assert len(done) == 1  # the third, at once, before the deadline
                got = Counter(await codes(calls))
                assert got == {RESOURCE_EXHAUSTED: 1, DEADLINE_EXCEEDED: 2}
            assert not front.clients and d.budget.used == 0
            assert (await infer(target)).outputs[0].name == "output__0"  # serving as before
        finally:
            await front.stop(None)
            d.parser.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="needs ::1 as a second client address")
def test_silent_calls_of_one_client_leave_the_port_to_the_others() -> None:
    """Before: 100 silent calls from one address (2 connections) made all 20 of another
    client's infers fail with RESOURCE_EXHAUSTED; the limit is gRPC's, so they held it until
    they closed."""

    async def go() -> None:
        d = await dispatcher()
        front = GrpcFront(d)
        port = await front.start("[::]", 0, max_rpcs=8)
        try:
            async with grpc.aio.insecure_channel(f"[::1]:{port}") as hostile:
                calls = silent_calls(hostile, 12)
                async with asyncio.timeout(20):  # those beyond the limit end at once
                    while sum(c.done() for c in calls) < 12 - 8:
                        await asyncio.sleep(0.01)
                for _ in range(5):
                    answer = await infer(f"127.0.0.1:{port}")
                    assert answer.outputs[0].name == "output__0"
                assert sum(c.done() for c in calls) == 12 - 2  # the share: a quarter of 8
                assert front.clients["[::1]"] == 2
                for c in calls:
                    c.cancel()
        finally:
            await front.stop(None)
            d.parser.close()

    asyncio.run(asyncio.wait_for(go(), 60))
