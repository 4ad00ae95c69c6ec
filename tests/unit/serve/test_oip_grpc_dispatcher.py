"""The Open Inference Protocol over gRPC at a real dispatcher, on a real port: tritonclient's
gRPC client (a third-party client of the protocol) for health, metadata and raw-contents
inference; the protocol's own messages for typed contents and hostile requests; the same
limits, shedding, arrivals and metrics as REST. The backend is in-process and answers like
the model service (each sample: the JSON row [sum of its floats])."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import numpy as np
import pytest
from dispatcher_support import GatedRows

from packrat.runtime import modelid
from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.oip.grpc_server import GrpcFront
from packrat.serve.dispatcher.oip.messages import SERVICE, message

tritonclient_grpc = pytest.importorskip("tritonclient.grpc.aio", reason="tritonclient[grpc]")

TINY = modelid.zoo_input_spec("tiny")


class Rows(GatedRows):
    refuse_negative = True


@asynccontextmanager
async def front(batches: list[int], **kwargs: Any) -> AsyncIterator[tuple[Dispatcher, Rows, str]]:
    instances = [
        InstanceSpec(index=i, name=f"tiny_i{i}", threads=1, batch=b, cpus=(i,))
        for i, b in enumerate(batches)
    ]
    backend = Rows()
    d = Dispatcher(model="tiny", instances=instances, backend=backend, **kwargs)
    d.inputs = TINY
    server = GrpcFront(d)
    port = await server.start("127.0.0.1", 0)
    try:
        yield d, backend, f"127.0.0.1:{port}"
    finally:
        backend.gate.set()
        await server.stop(None)
        d.parser.close()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def rows(n: int) -> np.ndarray:
    return np.arange(n * 16, dtype=np.float32).reshape(n, 16) / 7


async def call(target: str, method: str, request: Any, response: str) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        rpc = channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message(response).FromString,
        )
        return await rpc(request, timeout=10)


def test_tritonclient_grpc_health_metadata_and_raw_inference() -> None:
    async def go() -> None:
        async with front([4, 4]) as (d, _, target):
            client = tritonclient_grpc.InferenceServerClient(target)
            try:
                assert await client.is_server_live()
                assert not await client.is_server_ready()
                for i in range(2):
                    d.set_up(i, True)
                assert await client.is_server_ready()
                assert await client.is_model_ready("tiny")
                assert (await client.get_server_metadata()).name == "packrat"
                meta = await client.get_model_metadata("tiny")
                assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
                    ("input__0", "FP32", [-1, 16])
                ]
                x = rows(5)
                tensor = tritonclient_grpc.InferInput("input__0", [5, 16], "FP32")
                tensor.set_data_from_numpy(x)
                result = await client.infer("tiny", [tensor], request_id="r1")
                out = result.as_numpy("output__0")
                assert out.shape == (5, 1)
                np.testing.assert_allclose(out[:, 0], x.sum(axis=1), rtol=1e-5)
                assert result.get_response().id == "r1"
                with pytest.raises(Exception, match="not found"):
                    await client.get_model_metadata("other")
                bad = tritonclient_grpc.InferInput("input__0", [2, 17], "FP32")
                bad.set_data_from_numpy(np.zeros((2, 17), np.float32))
                with pytest.raises(Exception, match="shape"):
                    await client.infer("tiny", [bad])
            finally:
                await client.close()
            assert d.arrivals.total == 5  # five samples, five arrivals
            requests = d.metrics.requests
            assert requests.labels("tiny", "200")._value.get() == 1
            assert requests.labels("tiny", "400")._value.get() == 1

    run(go())


def test_typed_contents_infer_like_raw_contents() -> None:
    async def go() -> None:
        async with front([4]) as (d, _, target):
            d.set_up(0, True)
            x = rows(3)
            req = message("ModelInferRequest")(model_name="tiny", id="t")
            tensor = req.inputs.add(name="input__0", datatype="FP32", shape=[3, 16])
            tensor.contents.fp32_contents.extend(x.ravel().tolist())
            answer = await call(target, "ModelInfer", req, "ModelInferResponse")
            (out,) = answer.outputs
            assert (out.name, out.datatype, list(out.shape)) == ("output__0", "FP32", [3, 1])
            values = np.frombuffer(answer.raw_output_contents[0], dtype="<f4")
            np.testing.assert_allclose(values, x.sum(axis=1), rtol=1e-5)
            assert answer.id == "t"

    run(go())


def bad_requests() -> list[tuple[str, Any, str]]:
    M = message("ModelInferRequest")
    cases: list[tuple[str, Any, str]] = []
    r = M(model_name="tiny")
    cases.append(("no inputs", r, "non-empty"))
    r = M(model_name="tiny")
    r.inputs.add(name="input__0", datatype="FP32", shape=[9, 16])  # beyond the plan's 4
    r.raw_input_contents.append(b"\0" * 9 * 64)
    cases.append(("too many samples", r, "1..4 samples"))
    r = M(model_name="tiny")
    r.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    r.raw_input_contents.append(b"\0" * 63)
    cases.append(("short raw", r, "64 bytes"))
    r = M(model_name="tiny")
    t = r.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    t.contents.fp32_contents.extend([1.0] * 15)
    cases.append(("short typed", r, "16 values"))
    r = M(model_name="tiny")
    t = r.inputs.add(name="input__0", datatype="INT64", shape=[1, 16])
    t.contents.int64_contents.extend([1] * 16)
    cases.append(("wrong datatype", r, "datatype"))
    r = M(model_name="tiny")
    t = r.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    t.contents.fp32_contents.extend([1.0] * 16)
    r.raw_input_contents.append(b"\0" * 64)
    cases.append(("raw and typed", r, "exclusive"))
    r = M(model_name="tiny")
    t = r.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
    t.contents.fp32_contents.extend([1.0] * 16)
    r.outputs.add(name="nope")
    cases.append(("unknown output", r, "unknown output"))
    return cases


@pytest.mark.parametrize(("what", "request_", "text"), bad_requests())
def test_a_request_the_model_cannot_take_is_invalid_argument(
    what: str, request_: Any, text: str
) -> None:
    async def go() -> None:
        async with front([4]) as (d, _, target):
            d.set_up(0, True)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "ModelInfer", request_, "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
            assert text in (caught.value.details() or ""), caught.value.details()
            assert d.budget.used == 0 and d.pending == 0

    run(go())


def test_another_model_is_not_found_and_a_model_error_is_its_own() -> None:
    async def go() -> None:
        async with front([4]) as (d, _, target):
            d.set_up(0, True)
            M = message("ModelInferRequest")
            req = M(model_name="other")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "ModelInfer", req, "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            req = M(model_name="tiny")
            t = req.inputs.add(name="input__0", datatype="FP32", shape=[1, 16])
            t.contents.fp32_contents.extend([-1.0] * 16)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "ModelInfer", req, "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == "negative"

    run(go())


def test_a_full_queue_sheds_with_resource_exhausted_and_retry_after() -> None:
    async def go() -> None:
        async with front([1], queue_limit=1) as (d, backend, target):
            d.set_up(0, True)
            backend.gate.clear()
            M = message("ModelInferRequest")

            def one(n: int) -> Any:
                req = M(model_name="tiny")
                req.inputs.add(name="input__0", datatype="FP32", shape=[n, 16])
                req.raw_input_contents.append(b"\0" * 64 * n)
                return req

            held = [
                asyncio.create_task(call(target, "ModelInfer", one(1), "ModelInferResponse"))
                for _ in range(3)
            ]  # two in flight (two batches of 1), one queued: the queue is full
            async with asyncio.timeout(10):
                while d.slots.in_flight < 2 or d.slots.queued < 1:
                    await asyncio.sleep(0.005)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "ModelInfer", one(1), "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(caught.value.trailing_metadata() or ())["retry-after"] == "1"
            assert d.metrics.requests.labels("tiny", "503")._value.get() == 1
            backend.gate.set()
            await asyncio.gather(*held)

    run(go())


def test_a_message_beyond_the_plans_samples_is_refused_before_it_is_parsed() -> None:
    async def go() -> None:
        async with front([2]) as (d, _, target):
            d.set_up(0, True)
            d.max_body_bytes = 4096  # the pod's per-sample cap for this model
            req = message("ModelInferRequest")(model_name="tiny")
            req.inputs.add(name="input__0", datatype="BYTES", shape=[1])
            req.raw_input_contents.append(b"\0" * (3 * 4096))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "ModelInfer", req, "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert d.parser.pending == 0 and d.budget.used == 0

    run(go())


def test_grpc_refuses_a_message_over_the_cap_before_holding_it() -> None:
    """The port opens once the model's inputs (and so the cap) are known: a message beyond
    the cap is refused by gRPC itself, never handed to the dispatcher."""

    async def go() -> None:
        instances = [InstanceSpec(index=0, name="tiny_i0", threads=1, batch=2, cpus=(0,))]
        d = Dispatcher(model="tiny", instances=instances, backend=Rows())
        d.inputs = TINY
        d.max_body_bytes = 4096
        d.set_up(0, True)
        server = GrpcFront(d)
        port = await server.start("127.0.0.1", 0)
        try:
            req = message("ModelInferRequest")(model_name="tiny")
            req.inputs.add(name="input__0", datatype="FP32", shape=[2, 16])
            req.raw_input_contents.append(b"\0" * (64 * 1024))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(f"127.0.0.1:{port}", "ModelInfer", req, "ModelInferResponse")
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert d.metrics.requests.labels("tiny", "413")._value.get() == 0  # not ours
            assert d.budget.used == 0 and d.arrivals.total == 0
        finally:
            await server.stop(None)
            d.parser.close()

    run(go())
