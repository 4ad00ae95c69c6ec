"""The Open Inference Protocol (v2) over gRPC at the dispatcher, on either runtime.

The protocol's ``inference.GRPCInferenceService`` (:mod:`.messages`) on a port of its own
beside the REST port (8081 by default): ``ServerLive``, ``ServerReady``, ``ModelReady``,
``ServerMetadata``, ``ModelMetadata`` and ``ModelInfer`` with typed
``contents`` or ``raw_input_contents``. An infer request takes the REST path's every step
(:mod:`packrat.serve.dispatcher.v2`): its declared inputs are checked against the model
before any contents are converted, it carries at most the plan's batch, it is converted and
split in the dispatcher's parse pool (off the event loop), its bytes are reserved in the
buffer budget, its samples take places in the same queue (charged by samples, recorded as
arrivals for the tuner) and run on the same instances. Answers are ``raw_output_contents``
(what Triton sends; tritonclient and the KServe SDK both read it).

Errors are gRPC status codes: ``INVALID_ARGUMENT`` for a request the model cannot take,
``NOT_FOUND`` for another model, ``RESOURCE_EXHAUSTED`` when shed (queue full, too many bodies
buffered or being parsed; the trailing metadata carries ``retry-after``) or too large,
``UNAVAILABLE`` when the model server is gone, ``INTERNAL`` for the model's own failures.
Every infer is counted in the same series as REST's (``packrat_requests_total`` by the HTTP
status it maps from, so shedding alerts see both), and every call in
``packrat_grpc_requests_total`` by method and code. The protocol has no admin calls: the admin
API (canary, plan switch, arrivals) stays on the REST port, behind the pod's token.

Transport bounds: messages above the per-request cap are refused by gRPC itself before they
are buffered whole (``grpc.max_receive_message_length``), at most ``max_rpcs`` calls run at
once (beyond: ``RESOURCE_EXHAUSTED``, so memory held by received messages is at most
``max_rpcs`` times the cap), and connections idle or kept open too long are closed.
Those calls are counted by gRPC from the moment a call's headers arrive, before its message:
``ModelInfer`` is therefore served as a client-streaming method (the same bytes on the wire
as a unary call) so that the dispatcher sees the call at once and (issue 38) refuses a call
beyond its client's share (``max_per_client``, a quarter of ``max_rpcs`` as REST's connection
share is a quarter of its cap; ``RESOURCE_EXHAUSTED``) and ends a call whose message does not
arrive within ``receive_timeout_s`` (``DEADLINE_EXCEEDED``). Before, one client holding 21
calls open without sending their messages made every other client's infer fail, for as long
as it liked.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

import grpc
from aiohttp import web
from prometheus_client import Counter

from packrat.serve.dispatcher.canary import HEADER as CANARY_HEADER
from packrat.serve.dispatcher.oip.messages import SERVICE, message
from packrat.serve.dispatcher.v2 import VERSION, ParseBusyError, message_of
from packrat.serve.dispatcher.v2_codec import (
    OUTPUT,
    InferRequest,
    Tensor,
    V2Error,
    check_declared,
    check_outputs,
    element_size,
    model_metadata,
    numeric_raw,
    pack,
    pack_bytes,
    refuse_classification,
    split_samples,
    stack_answers,
    unpack_bytes,
)

if TYPE_CHECKING:
    from packrat.serve.dispatcher.app import Dispatcher

__all__ = ["DEFAULT_GRPC_PORT", "GrpcFront", "grpc_code", "to_infer_request"]

DEFAULT_GRPC_PORT = 8081

# datatype -> the InferTensorContents field that carries it
_CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_REQ = {
    name: message(f"{name}Request")
    for name in (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
    )
}
_RESP = {name: message(f"{name}Response") for name in _REQ}


def grpc_code(status: int, *, shed: bool = False) -> grpc.StatusCode:
    """The gRPC status for an HTTP status of the REST path (``shed``: a 503 with
    ``Retry-After``, the dispatcher shedding load, rather than the model server gone)."""
    if status == 503:
        return grpc.StatusCode.RESOURCE_EXHAUSTED if shed else grpc.StatusCode.UNAVAILABLE
    codes = {
        401: grpc.StatusCode.UNAUTHENTICATED,
        404: grpc.StatusCode.NOT_FOUND,
        408: grpc.StatusCode.DEADLINE_EXCEEDED,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    if status in codes:
        return codes[status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= status < 500 else grpc.StatusCode.INTERNAL


def to_infer_request(
    msg: Any, inputs: Sequence[Mapping[str, Any]] | None, max_samples: int
) -> tuple[InferRequest, list[tuple[bytes, str]]]:
    """A ``ModelInferRequest`` as the codec's request and its samples: the declared inputs
    are checked first (no contents converted for a request the model cannot take). Raises
    :class:`V2Error` only (runs in the parse pool)."""
    try:
        declared = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for t in msg.inputs]  # fmt: skip
        if not declared:
            raise V2Error("'inputs' must be a non-empty array")
        check_declared(declared, inputs, max_samples)
        raw = list(msg.raw_input_contents)
        if raw and len(raw) != len(declared):
            raise V2Error(f"raw_input_contents has {len(raw)} entries for {len(declared)} inputs")
        tensors = [
            _tensor(t, raw[k] if raw else None, bool(t.HasField("contents")))
            for k, t in enumerate(msg.inputs)
        ]
        req = InferRequest(
            id=msg.id or None,
            inputs=tuple(tensors),
            binary={o.name: True for o in msg.outputs},
        )
        for o in msg.outputs:
            refuse_classification(dict(o.parameters))
        return req, split_samples(req, inputs, max_samples=max_samples)
    except V2Error:
        raise
    except Exception as exc:  # a hostile request fails alone, whatever it trips over
        raise V2Error(f"malformed inference request: {type(exc).__name__}: {exc}"[:300]) from None


def _tensor(t: Any, raw: bytes | None, typed: bool) -> Tensor:
    name, datatype, shape = t.name, t.datatype, tuple(int(d) for d in t.shape)
    count = math.prod(shape)
    if raw is not None:
        if typed:
            raise V2Error(f"input {name}: contents and raw_input_contents are exclusive")
        if datatype == "BYTES":
            items = unpack_bytes(raw, name)
            if len(items) != count:
                raise V2Error(f"input {name}: shape needs {count} elements, got {len(items)}")
            return Tensor(name, datatype, shape, items=items)
        width = element_size(datatype)
        if width is None:
            raise V2Error(f"input {name}: datatype {datatype} is not supported")
        if len(raw) != count * width:
            raise V2Error(f"input {name}: raw contents must be {count * width} bytes")
        return Tensor(name, datatype, shape, raw=raw)
    field = _CONTENTS.get(datatype)
    if field is None:
        raise V2Error(f"input {name}: datatype {datatype} is not supported (send raw contents)")
    values = getattr(t.contents, field)
    if len(values) != count:
        raise V2Error(f"input {name}: shape needs {count} values, got {len(values)}")
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, items=tuple(values))
    return Tensor(name, datatype, shape, raw=numeric_raw(name, datatype, values))


def to_response(model: str, req: InferRequest, answers: Sequence[bytes], *, raw_bytes: bool) -> Any:
    """The ``ModelInferResponse`` for the samples' answers (JSON rows; ``raw_bytes``: a
    .mar's bodies as one BYTES output). V2Error: an output the model does not have;
    ValueError: answers that do not stack."""
    check_outputs(req)
    out = _RESP["ModelInfer"](model_name=model, model_version=VERSION, id=req.id or "")
    if raw_bytes:
        datatype, shape, data = "BYTES", [len(answers)], pack_bytes(answers)
    else:
        datatype, shape, flat = stack_answers(answers)
        data = pack(datatype, flat)
    out.outputs.add(name=OUTPUT, datatype=datatype, shape=shape)
    out.raw_output_contents.append(data)
    return out


class RpcError(Exception):
    """An infer's failure: its HTTP-equivalent status, message and who answered."""

    def __init__(
        self, status: int, text: str, source: str, *, shed: bool = False, ran: bool = False
    ) -> None:
        super().__init__(text)
        self.status, self.text, self.source, self.shed = status, text, source, shed
        self.ran = ran  # its samples ran: an answer, logged


class Received(NamedTuple):
    """A ModelInferRequest as received (``raw``, for the request log) and parsed."""

    raw: bytes
    message: Any


GRPC_TYPE = "application/grpc"


def client_of(peer: str) -> str:
    """A call's client address from gRPC's peer (``ipv4:10.0.0.7:5123``, ``ipv6:[::1]:5123``):
    the address without the port, the client's share is per address."""
    host = peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return unquote(host.split(":", 1)[-1])


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's metadata as headers for the request log (text values only)."""
    pairs = context.invocation_metadata() or ()
    out = {str(k): v for k, v in pairs if isinstance(v, str)}
    if "x-request-id" in out:  # gRPC metadata keys are lower case
        out["X-Request-Id"] = out.pop("x-request-id")
    out["Content-Type"] = GRPC_TYPE
    return out


class GrpcFront:
    """The gRPC server in front of dispatcher ``d`` (in the dispatcher's event loop)."""

    def __init__(self, d: Dispatcher, *, alive: Callable[[], bool] | None = None) -> None:
        self.d = d
        self.alive = alive
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        self.max_per_client = 1
        self.receive_timeout_s = 10.0
        self.clients: Tally[str] = Tally()  # infer calls open, by client address
        self._calls = Counter(
            "packrat_grpc_requests",
            "Open Inference Protocol calls on the gRPC port, by method and status code.",
            ["model", "method", "code"],
            registry=d.metrics.registry,
        )

    def message_cap(self) -> int:
        """The largest ModelInferRequest worth receiving: the plan's batch of samples."""
        d = self.d
        return min(d.batch_body_bytes, d.max_samples * d.max_body_bytes)

    async def start(
        self,
        host: str,
        port: int,
        *,
        max_rpcs: int | None = None,
        max_per_client: int | None = None,
        receive_timeout_s: float = 10.0,
    ) -> int:
        """Listen on ``host:port`` (0: any free port); the port bound."""
        d = self.d
        cap = self.message_cap()
        if max_rpcs is None:  # what the buffer budget holds of the largest messages
            max_rpcs = max(16, min(d.slots.queue_limit, d.max_buffered_bytes // cap))
        self.max_per_client = max_per_client or max(1, max_rpcs // 4)
        self.receive_timeout_s = receive_timeout_s
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", cap + 4096),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_concurrent_streams", 64),
                ("grpc.max_connection_idle_ms", 300_000),
                ("grpc.http2.max_ping_strikes", 2),
            ],
            maximum_concurrent_rpcs=max_rpcs,
        )
        server.add_generic_rpc_handlers((self._handler(),))
        self.port = server.add_insecure_port(f"{host}:{port}")
        await server.start()
        self.server = server
        return self.port

    async def stop(self, grace_s: float | None) -> None:
        """Refuse new calls, let those in flight finish (at most ``grace_s``)."""
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None

    def _handler(self) -> grpc.GenericRpcHandler:
        methods = {
            "ServerLive": self._live,
            "ServerReady": self._server_ready,
            "ModelReady": self._model_ready,
            "ServerMetadata": self._server_metadata,
            "ModelMetadata": self._model_metadata,
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._counted(name, fn),
                request_deserializer=_REQ[name].FromString,
                response_serializer=_RESP[name].SerializeToString,
            )
            for name, fn in methods.items()
        }
        # ModelInfer keeps the bytes as received and sends the bytes it serialized itself,
        # so the request log gets both without serializing anything again; client-streaming,
        # so that the call is ours before its message arrives (see the module)
        parse = _REQ["ModelInfer"].FromString
        handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
            self._counted("ModelInfer", self._infer_call),
            request_deserializer=lambda raw: Received(raw, parse(raw)),
            response_serializer=bytes,
        )
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _counted(self, name: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        counter = self._calls

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                answer = await fn(request, context)
            except RpcError as exc:
                code = grpc_code(exc.status, shed=exc.shed)
                counter.labels(self.d.model, name, code.name).inc()
                metadata = (("retry-after", str(self.d.retry_after_s)),) if exc.shed else ()
                await context.abort(code, exc.text, trailing_metadata=metadata)
            counter.labels(self.d.model, name, "OK").inc()
            return answer

        return call

    # -- health and metadata ---------------------------------------------------------------------
    def _known(self, name: str, version: str) -> None:
        d = self.d
        if name != d.model:
            raise RpcError(404, f"model {name!r} not found; this server serves {d.model!r}", "")
        if version and version != VERSION:
            raise RpcError(404, f"model {name!r} has version {VERSION} only", "")

    async def _live(self, _request: Any, _context: Any) -> Any:
        return _RESP["ServerLive"](live=self.alive is None or self.alive())

    async def _server_ready(self, _request: Any, _context: Any) -> Any:
        return _RESP["ServerReady"](ready=self.d.ready)

    async def _model_ready(self, request: Any, _context: Any) -> Any:
        self._known(request.name, request.version)
        return _RESP["ModelReady"](ready=self.d.ready)

    async def _server_metadata(self, _request: Any, _context: Any) -> Any:
        return _RESP["ServerMetadata"](name="packrat", version=VERSION, extensions=[])

    async def _model_metadata(self, request: Any, _context: Any) -> Any:
        self._known(request.name, request.version)
        doc = model_metadata(self.d.model, self.d.inputs, self.d.output)
        out = _RESP["ModelMetadata"](
            name=doc["name"], versions=doc["versions"], platform=doc["platform"]
        )
        for key in ("inputs", "outputs"):
            for item in doc[key]:
                getattr(out, key).add(**item)
        return out

    # -- inference -------------------------------------------------------------------------------
    async def _infer_call(
        self, messages: AsyncIterator[Received], context: grpc.aio.ServicerContext
    ) -> bytes:
        """One infer call: within its client's share, its (first) message in time."""
        client = client_of(context.peer() or "")
        if self.clients[client] >= self.max_per_client:
            raise RpcError(
                503, f"{self.max_per_client} calls of this client already open", "", shed=True
            )
        self.clients[client] += 1
        try:
            try:
                async with asyncio.timeout(self.receive_timeout_s):
                    received = await anext(aiter(messages))
            except TimeoutError:
                text = f"no request message within {self.receive_timeout_s:g} s"
                raise RpcError(408, text, "") from None
            except StopAsyncIteration:
                raise RpcError(400, "the call carried no request message", "") from None
            return await self._infer(received, context)
        finally:
            self.clients[client] -= 1
            if not self.clients[client]:
                del self.clients[client]

    async def _infer(self, received: Received, context: grpc.aio.ServicerContext) -> bytes:
        from packrat.serve.dispatcher.app import Stage

        d, start, track = self.d, time.perf_counter(), Stage()
        try:
            out, canary = await self._infer_counted(received.message, start, track)
        except RpcError as exc:
            d.finish(web.Response(status=exc.status), start, exc.source or "dispatcher")
            if exc.ran:  # answered after its samples ran: logged as REST's answers are
                failed = web.Response(status=exc.status, text=exc.text)
                d.offer_log(_headers(context), received.raw, failed, start)
            raise
        except asyncio.CancelledError:
            d.metrics.cancelled.labels(d.model, track.stage).inc()
            raise
        data: bytes = out.SerializeToString()
        answer = web.Response(status=200, body=data, content_type=GRPC_TYPE)
        d.offer_log(_headers(context), received.raw, answer, start)
        d.finish(answer, start, "canary" if canary else d.source)
        if canary:  # as REST marks an answer the canary gave
            context.set_trailing_metadata(((CANARY_HEADER.lower(), "true"),))
        return data

    async def _infer_counted(self, request: Any, start: float, track: Any) -> tuple[Any, bool]:
        d = self.d
        self._known(request.model_name, request.model_version)
        if d.failed:
            raise RpcError(503, "the model server is gone", "dispatcher")
        size = request.ByteSize()
        if size > self.message_cap():
            raise RpcError(413, f"request too large: {size} bytes", "dispatcher")
        if not d.slots.admissible():
            raise RpcError(503, "queue full", "dispatcher", shed=True)
        if not d.budget.reserve(size):
            raise RpcError(503, "too many request bodies buffered", "dispatcher", shed=True)
        try:
            try:
                req, samples = await d.parser.run(
                    to_infer_request, request, d.inputs, d.max_samples, size=size
                )
            except V2Error as exc:
                raise RpcError(400, str(exc), "dispatcher") from None
            except ParseBusyError:
                raise RpcError(
                    503, "too many requests being parsed", "dispatcher", shed=True
                ) from None
            if not d.slots.admissible(len(samples)):
                raise RpcError(503, "queue full", "dispatcher", shed=True)
            d.arrivals.record(len(samples))
            track.stage = "queued"
            answers = await self._run(samples, track)
        finally:
            d.budget.release(size)
        failed = next((a for a in answers if a.response.status != 200), None)
        if failed is not None:
            r = failed.response
            shed = r.status == 503 and "Retry-After" in r.headers
            raise RpcError(r.status, message_of(r), failed.source, shed=shed, ran=True)
        bodies = [a.response.body if isinstance(a.response.body, bytes) else b"" for a in answers]
        try:
            raw_bytes = d.inputs is None
            out = await d.parser.run(
                lambda: to_response(d.model, req, bodies, raw_bytes=raw_bytes),
                size=sum(map(len, bodies)),
            )
        except V2Error as exc:
            raise RpcError(400, str(exc), "dispatcher", ran=True) from None
        except ParseBusyError:
            raise RpcError(503, "too many answers being encoded", "dispatcher", shed=True) from None
        except ValueError as exc:
            raise RpcError(500, f"the model's answers: {exc}", d.source, ran=True) from None
        return out, any(a.source == "canary" for a in answers)

    async def _run(self, samples: list[tuple[bytes, str]], track: Any) -> list[Any]:
        """The samples through the queue and the instances; once they run, a client that
        cancels does not cancel them (each holds its slot until its worker answers)."""
        d = self.d
        runs = asyncio.gather(*(d.run_sample(None, {"Content-Type": t}, b, track)
                                for b, t in samples))  # fmt: skip
        return list(await asyncio.shield(runs))
