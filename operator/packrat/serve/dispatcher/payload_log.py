"""Request and response logging at the serving pod: off by default, sampled, bounded, and never
in the way of serving.

When it is on (``packrat serve --request-log SINK``, ``spec.requestLogging`` of a
PackratModel), the dispatcher hands every prediction the model answered to :meth:`offer`, which
draws the sample (``sample_rate``), cuts each body to ``max_body_bytes`` and puts one record in
a queue of at most ``queue_size`` records, without awaiting anything: a full queue drops the
record and counts it (``packrat_payload_log_records_total{outcome="dropped"}``). Requests the
dispatcher refused or shed itself are counted in the serving metrics, not logged.

Worker tasks empty the queue into the sink:

- ``jsonl:PATH`` (``-`` for standard output): one JSON object per prediction and line, written
  from a thread, so that file I/O never runs on the event loop;
- ``http://...`` or ``https://...``: a CloudEvents sink (a Knative broker, an event gateway):
  two events per prediction, ``dev.packrat.inference.request`` and
  ``dev.packrat.inference.response``, with the same ``id``, POSTed in the HTTP binding's binary
  mode (``ce-*`` headers, the body as it was) or structured mode
  (``application/cloudevents+json``). Each POST has a total deadline (``timeout_s``), follows no
  redirect, and at most ``concurrency`` are open; a failed one is counted and not retried.

The queue is inside the pod's memory budget (issue 38): besides ``queue_size`` records, it holds
at most ``max_queue_bytes`` of them (their bodies as cut, plus :data:`RECORD_OVERHEAD` each),
and every record is charged to the dispatcher's buffer budget until its sink took it; one that
does not fit is dropped and counted, so a hung sink costs a bounded, accounted amount.

The sink obeys an egress policy (:mod:`packrat.runtime.egress`): its URL is read by the fetch's
one parser (a plain host[:port]), and it may reach the cluster's private ranges
(:data:`~packrat.runtime.egress.CLUSTER_RANGES`: an in-cluster broker) and public addresses,
never loopback (the pod's own internal ports), link-local (the metadata services),
unspecified, multicast or reserved ones, unless ``egress_allow`` covers them. A literal address
is checked when the settings are made; a name at every connection, every address it resolves
to (a name resolving to loopback gets nothing).

The CloudEvents encoding is written here rather than taken from the ``cloudevents`` SDK: it is
a handful of headers and fields, and the serving image stays without another dependency; the
tests decode what is sent with that SDK.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import random
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from prometheus_client import CollectorRegistry, Counter, Gauge

from packrat.runtime.egress import CLUSTER_RANGES, EgressError, EgressPolicy, split_url
from packrat.serve.dispatcher.connections import BufferBudget

REQUEST_TYPE = "dev.packrat.inference.request"
RESPONSE_TYPE = "dev.packrat.inference.response"
MODES = ("binary", "structured")
_TEXT = re.compile(r"^(application/(.+\+)?json|text/.+)(;.*)?$", re.I)
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")
RECORD_OVERHEAD = 1024  # bytes a record costs beside its bodies (objects, id, headers)


class PayloadLogError(ValueError):
    """A request-logging setting is invalid (one line for the CLI)."""


@dataclass(frozen=True, slots=True)
class PayloadLogConfig:
    """Where records go and how many: see the module docstring."""

    sink: str
    sample_rate: float = 1.0
    mode: str = "binary"
    queue_size: int = 1000
    max_body_bytes: int = 64 * 1024
    timeout_s: float = 5.0
    concurrency: int = 4
    source: str = "/packrat"
    max_queue_bytes: int = 16 * 1024 * 1024
    egress_allow: tuple[str, ...] = ()  # CIDR ranges a sink may reach beyond the policy's

    def __post_init__(self) -> None:
        if not (self.sink.startswith(("http://", "https://", "jsonl:"))):
            raise PayloadLogError(
                f"request log sink {self.sink!r}: expected jsonl:PATH, jsonl:- or an "
                "http(s):// CloudEvents URL"
            )
        if self.cloudevents:
            self._check_sink()
        if self.sink == "jsonl:":
            raise PayloadLogError("request log sink jsonl: needs a path (or - for stdout)")
        if not 0.0 < self.sample_rate <= 1.0:
            raise PayloadLogError(
                f"request log sample rate must be in (0, 1], got {self.sample_rate}"
            )
        if self.mode not in MODES:
            raise PayloadLogError(f"request log mode must be one of {', '.join(MODES)}")
        for name, value, low, high in (
            ("queue size", self.queue_size, 1, 1_000_000),
            ("max body bytes", self.max_body_bytes, 0, 16 * 1024 * 1024),
            ("concurrency", self.concurrency, 1, 64),
            ("max queue bytes", self.max_queue_bytes, 1024, 1024**3),
        ):
            if not low <= value <= high:
                raise PayloadLogError(f"request log {name} must be in {low}..{high}, got {value}")
        if not 0.0 < self.timeout_s <= 60.0:
            raise PayloadLogError(f"request log timeout must be in (0, 60] s, got {self.timeout_s}")

    @property
    def cloudevents(self) -> bool:
        return self.sink.startswith(("http://", "https://"))

    def policy(self) -> EgressPolicy:
        """Where the sink may be: see the module docstring."""
        try:
            return EgressPolicy.parse([*CLUSTER_RANGES, *self.egress_allow])
        except ValueError as exc:
            raise PayloadLogError(f"request log egress allow: {exc}") from None

    def _check_sink(self) -> None:
        try:
            host = split_url(self.sink).host.rstrip(".")
        except EgressError as exc:
            raise PayloadLogError(f"request log sink: {exc.message}") from None
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if host == "localhost" or host.endswith(".localhost"):
            literal = ipaddress.ip_address("127.0.0.1")
        if literal is not None and not self.policy().allows_address(literal):
            raise PayloadLogError(
                f"request log sink {self.sink!r}: {host} is an internal address (loopback, "
                "link-local, unspecified...) that the sink's egress policy refuses"
            )


@dataclass(frozen=True, slots=True)
class Body:
    """One side's body as logged: at most ``max_body_bytes`` of it."""

    content_type: str
    data: bytes
    size: int

    @property
    def truncated(self) -> bool:
        return len(self.data) < self.size

    @classmethod
    def cut(cls, content_type: str | None, data: bytes, limit: int) -> Body:
        return cls(content_type or "application/octet-stream", data[:limit], len(data))

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "contentType": self.content_type,
            "bytes": self.size,
            "truncated": self.truncated,
        }
        text = self.text()
        if text is not None:
            out["body"] = text
        else:
            out["bodyBase64"] = base64.b64encode(self.data).decode("ascii")
        return out

    def text(self) -> str | None:
        if not _TEXT.match(self.content_type):
            return None
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            return None


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Record:
    id: str
    epoch: float  # formatted by the workers, not on the request path
    model: str
    status: int
    latency_ms: float
    request: Body
    response: Body
    cost: int = 0  # bytes charged to the queue's share and the pod's buffer budget

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": _iso(self.epoch),
            "model": self.model,
            "status": self.status,
            "latencyMs": round(self.latency_ms, 3),
            "request": self.request.as_json(),
            "response": self.response.as_json(),
        }


def request_id(headers: Mapping[str, str]) -> str:
    """The client's ``X-Request-Id`` when it is a short printable token, else a fresh one."""
    given = headers.get("X-Request-Id", "")
    return given if _REQUEST_ID.match(given) else os.urandom(16).hex()  # uuid4: 3x the time


def _attributes(
    record: Record, *, kind: str, source: str
) -> tuple[Body, dict[str, str], dict[str, str]]:
    """The event's body, its required CloudEvents attributes and its extensions (status on a
    response, truncated when cut), the same in both modes; each mode names them its own way."""
    body = record.request if kind == REQUEST_TYPE else record.response
    required = {
        "specversion": "1.0",
        "id": record.id,
        "source": source,
        "type": kind,
        "time": _iso(record.epoch),
        "model": record.model,
    }
    extensions: dict[str, str] = {}
    if kind == RESPONSE_TYPE:
        extensions["status"] = str(record.status)
    if body.truncated:
        extensions["truncated"] = "true"
    return body, required, extensions


def binary_event(record: Record, *, kind: str, source: str) -> tuple[dict[str, str], bytes]:
    """(headers, body) of one event in the HTTP binding's binary mode."""
    body, required, extensions = _attributes(record, kind=kind, source=source)
    headers = {f"ce-{name}": value for name, value in required.items()}
    headers["Content-Type"] = body.content_type
    headers.update((f"ce-{name}", value) for name, value in extensions.items())
    return headers, body.data


def structured_event(record: Record, *, kind: str, source: str) -> tuple[dict[str, str], bytes]:
    """(headers, body) of one event in structured mode (``application/cloudevents+json``)."""
    body, required, extensions = _attributes(record, kind=kind, source=source)
    event: dict[str, Any] = {**required, "datacontenttype": body.content_type, **extensions}
    text = body.text()
    if text is not None and not body.truncated and "json" in body.content_type.lower():
        try:
            event["data"] = json.loads(text)
        except ValueError:
            event["data"] = text
    elif text is not None:
        event["data"] = text
    else:
        event["data_base64"] = base64.b64encode(body.data).decode("ascii")
    payload = json.dumps(event, separators=(",", ":")).encode()
    return {"Content-Type": "application/cloudevents+json; charset=utf-8"}, payload


class PayloadLogger:
    """The queue, its workers and the sink (one per dispatcher)."""

    def __init__(
        self,
        config: PayloadLogConfig,
        *,
        model: str,
        registry: CollectorRegistry,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.rng = rng or random.Random()
        self.queue: asyncio.Queue[Record] = asyncio.Queue(maxsize=config.queue_size)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._file: TextIO | None = None
        records = Counter(
            "packrat_payload_log_records",
            "Predictions offered to the request log, by outcome: logged (written or every "
            "event sent), dropped (queue full), failed (the sink refused or timed out).",
            ["model", "outcome"],
            registry=registry,
        )
        self._outcome = {o: records.labels(model, o) for o in ("logged", "dropped", "failed")}
        # the dispatcher's buffer budget (set by the dispatcher), and the bytes queued here
        self.budget: BufferBudget | None = None
        self.queued_bytes = 0
        Gauge(
            "packrat_payload_log_queue_depth",
            "Records waiting for the request log's sink.",
            ["model"],
            registry=registry,
        ).labels(model).set_function(self.queue.qsize)

    # -- the dispatcher's side: never awaits --------------------------------------------------
    def offer(
        self,
        *,
        headers: Mapping[str, str],
        request_body: bytes,
        status: int,
        response_headers: Mapping[str, str],
        response_body: bytes,
        latency_s: float,
    ) -> None:
        if self.config.sample_rate < 1.0 and self.rng.random() >= self.config.sample_rate:
            return
        limit = self.config.max_body_bytes
        cost = min(len(request_body), limit) + min(len(response_body), limit) + RECORD_OVERHEAD
        if self.queue.full() or not self._charge(cost):  # dropped before any work: a hung
            self._outcome["dropped"].inc()  # sink costs serving nothing
            return
        record = Record(
            id=request_id(headers),
            epoch=time.time(),
            model=self.model,
            status=status,
            latency_ms=latency_s * 1000.0,
            request=Body.cut(headers.get("Content-Type"), request_body, limit),
            response=Body.cut(response_headers.get("Content-Type"), response_body, limit),
            cost=cost,
        )
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            self._release(cost)
            self._outcome["dropped"].inc()

    def _charge(self, cost: int) -> bool:
        if self.queued_bytes + cost > self.config.max_queue_bytes:
            return False
        if self.budget is not None and not self.budget.reserve(cost):
            return False
        self.queued_bytes += cost
        return True

    def _release(self, cost: int) -> None:
        self.queued_bytes -= cost
        if self.budget is not None:
            self.budget.release(cost)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.config.cloudevents:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
                connector=aiohttp.TCPConnector(
                    limit=self.config.concurrency,
                    resolver=_PolicyResolver(self.config.policy()),
                    use_dns_cache=False,  # every connection's addresses checked afresh
                ),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            workers = self.config.concurrency
        else:
            path = self.config.sink.removeprefix("jsonl:")
            self._file = sys.stdout if path == "-" else await asyncio.to_thread(_open, path)
            workers = 1
        self._tasks = [asyncio.create_task(self._work()) for _ in range(workers)]

    async def close(self, flush_s: float = 2.0) -> None:
        """Give the queue ``flush_s`` to empty, then stop the workers and close the sink."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_s):
                await self.queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._file is not None and self._file is not sys.stdout:
            await asyncio.to_thread(self._file.close)

    # -- the workers -----------------------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            if self._file is not None:  # lines go out together: one thread hop per batch
                while len(batch) < 256 and not self.queue.empty():
                    batch.append(self.queue.get_nowait())
            try:
                ok = await self._deliver(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # the sink's problem, never the dispatcher's
                ok = False
            for record in batch:
                self._release(record.cost)
                self._outcome["logged" if ok else "failed"].inc()
                self.queue.task_done()

    async def _deliver(self, batch: list[Record]) -> bool:
        if self._file is not None:
            lines = "".join(json.dumps(r.as_json(), separators=(",", ":")) + "\n" for r in batch)
            await asyncio.to_thread(_write, self._file, lines)
            return True
        (record,) = batch
        encode = binary_event if self.config.mode == "binary" else structured_event
        for kind in (REQUEST_TYPE, RESPONSE_TYPE):
            headers, body = encode(record, kind=kind, source=self.config.source)
            if not await self._post(headers, body):
                return False
        return True

    async def _post(self, headers: dict[str, str], body: bytes) -> bool:
        assert self._session is not None
        try:
            async with self._session.post(
                self.config.sink, data=body, headers=headers, allow_redirects=False
            ) as answer:
                return 200 <= answer.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False


class _PolicyResolver(AbstractResolver):
    """aiohttp's name resolution under an egress policy: every address a name resolves to is
    checked, and a name with any refused address resolves to nothing (a literal address never
    reaches a resolver: it is checked with the settings)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        out: list[ResolveResult] = []
        for fam, _, proto, _, address in infos:
            ip = ipaddress.ip_address(str(address[0]).split("%")[0])
            if not self.policy.allows_address(ip):
                raise OSError(f"{host}: refused by the request log's egress policy")
            out.append(
                {
                    "hostname": host,
                    "host": str(address[0]),
                    "port": int(address[1]),
                    "family": fam,
                    "proto": proto,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return out

    async def close(self) -> None:
        return None


def _open(path: str) -> TextIO:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", encoding="utf-8")


def _write(handle: TextIO, text: str) -> None:
    handle.write(text)
    handle.flush()
