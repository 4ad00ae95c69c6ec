"""Canary traffic at the serving pod: a share of the predictions this dispatcher admits goes to
the canary's Service instead of the local instances.

Why here: a Kubernetes Service cannot weight its endpoints (kube-proxy spreads connections
over the ready pods evenly), so a split by replica ratio is as coarse as the replica counts (one
canary pod beside four stable ones is 20% or nothing) and, with kept-alive client connections,
not even that. Every prediction already passes through a stable pod's dispatcher, which can
send exactly ``percent`` of them on: :meth:`CanarySplit.take` spreads them evenly (error
diffusion: after n requests, floor(n * percent / 100) went to the canary), whatever the
client's connections. No service mesh, no new hop for the stable share.

A forwarded request never fails because of the canary: when the canary cannot be reached, times
out, sheds (503), fails (5xx), redirects (3xx: never followed, never passed on) or answers more
than ``max_answer_bytes``, the request is served here as if it had not been taken, and the
canary's failure is counted; its 4xx answers go back to the client as they are, and count
against it too (the operator's rollback counts 4xx and 503: a canary answering 400 to
everything must roll back). Each answer the canary gave carries ``X-Packrat-Canary: true``.

A bad canary must not hurt the stable pod either: its answer is read under a byte cap and
charged to the pod's buffer budget before it is read (its declared length, else the cap; a
budget too full to hold it serves the request here, unread), and the clients' credentials
(``Authorization``, ``Cookie``) stay with the stable pod: the canary's URL gets neither.

What the canary did (its requests, errors and the P99 of its latencies, over the last
``window`` forwarded requests) is in ``/status`` (``canary``) and in
``packrat_canary_requests_total``: the operator reads it to roll the canary back by itself
when its error rate or P99 crosses the model's thresholds.

The operator sets and clears the split with ``POST /admin/canary`` (the pods' admin bearer
token): ``{"url": "http://<canary service>/predictions/<model>", "percent": 20, "id": "..."}``;
percent 0 stops it. A new URL or id (the operator's: the canary's model) starts the counts
afresh, so a new canary behind the same Service is never judged by an older one's counts.
"""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from packrat.serve.auth import AdminToken, bearer_accepted
from packrat.serve.dispatcher.connections import BufferBudget
from packrat.serve.dispatcher.upstream import passthrough

HEADER = "X-Packrat-Canary"
MAX_URL = 2048
MAX_BODY = 4096  # bytes of a POST /admin/canary
# the largest canary answer read (the request body cap's default, a pod's JSON answer)
DEFAULT_MAX_ANSWER_BYTES = 6 * 1024 * 1024
# a client's credentials for the stable Service, never sent on to the canary's URL
PRIVATE_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _to_canary(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in passthrough(headers.items()).items() if k.lower() not in PRIVATE_HEADERS
    }


class _TooLargeError(Exception):
    """The canary's answer is over the cap: its failure."""


class _NoRoomError(Exception):
    """The buffer budget cannot hold the canary's answer now: not the canary's failure."""


class CanarySplit:
    """Where canary traffic goes, how much of it, and what came back (one per dispatcher)."""

    def __init__(
        self,
        *,
        model: str,
        registry: CollectorRegistry,
        timeout_s: float = 30.0,
        window: int = 1000,
        max_connections: int = 64,
        budget: BufferBudget | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self.model = model
        self.budget = budget or BufferBudget(max_answer_bytes * max_connections)
        self.max_answer_bytes = max_answer_bytes
        self.url: str | None = None
        self.ident = ""
        self.percent = 0
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._credit = 0  # error diffusion: hundredths of a request owed to the canary
        self._session: aiohttp.ClientSession | None = None
        self.latencies: collections.deque[float] = collections.deque(maxlen=window)
        self.counts = {"served": 0, "errors": 0, "shed": 0, "client_errors": 0}
        counter = Counter(
            "packrat_canary_requests",
            "Predictions this pod forwarded to the canary, by outcome: served (2xx), "
            "client_error (4xx, passed back), error (5xx, unreachable, timeout: served here) "
            "and shed (the canary's 503: served here).",
            ["model", "outcome"],
            registry=registry,
        )
        self._outcome = {
            k: counter.labels(model, v)
            for k, v in (
                ("served", "served"),
                ("errors", "error"),
                ("shed", "shed"),
                ("client_errors", "client_error"),
            )
        }

    # -- configuration ---------------------------------------------------------------------------
    def configure(self, url: str | None, percent: int, ident: str = "") -> None:
        """Send ``percent`` of the traffic to ``url`` (None or 0: none). A new URL or ``ident``
        (which canary it is): new counts."""
        if not url or percent <= 0:
            url, percent, ident = None, 0, ""
        if (url, ident) != (self.url, self.ident):
            self.latencies.clear()
            self.counts = dict.fromkeys(self.counts, 0)
            self._credit = 0
        self.url, self.percent, self.ident = url, percent, ident

    def take(self) -> bool:
        """Whether this request goes to the canary: exactly ``percent`` in every hundred."""
        if self.percent <= 0:
            return False
        self._credit += self.percent
        if self._credit >= 100:
            self._credit -= 100
            return True
        return False

    # -- the forward -----------------------------------------------------------------------------
    async def forward(
        self, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> tuple[web.Response, int] | None:
        """The canary's answer and the bytes of :attr:`budget` it holds (the caller releases
        them once done with it), or None when the request must be served here."""
        url = self.url
        if url is None:
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                auto_decompress=False,  # the cap is on the bytes that arrive, as passed on
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        start = time.perf_counter()
        held = 0
        kept = False
        try:
            async with self._session.post(
                url, data=body, headers=_to_canary(headers), params=query, allow_redirects=False
            ) as answer:
                status = answer.status
                if 200 <= status < 300 or (400 <= status < 500 and status != 429):
                    held = self._hold(answer.content_length)
                    payload = await self._read(answer)
                    kept = True
                out = passthrough(answer.headers.items())
        except _NoRoomError:
            return None
        except (_TooLargeError, aiohttp.ClientError, TimeoutError, OSError):
            self._count("errors", time.perf_counter() - start, url)
            return None
        finally:
            if not kept:
                self.budget.release(held)
        if status in (429, 503):
            self._count("shed", None, url)
            return None
        if not (200 <= status < 300 or 400 <= status < 500):  # 5xx, 3xx, 1xx: served here
            self._count("errors", time.perf_counter() - start, url)
            return None
        self._count("served" if status < 400 else "client_errors", time.perf_counter() - start, url)
        out[HEADER] = "true"
        return web.Response(status=status, body=payload, headers=out), held

    def _hold(self, declared: int | None) -> int:
        """Reserve the answer's bytes (its declared length, else the cap) before reading."""
        if declared is not None and declared > self.max_answer_bytes:
            raise _TooLargeError
        want = declared if declared is not None else self.max_answer_bytes
        if not self.budget.reserve(want):
            raise _NoRoomError  # nothing held: served here, not counted against the canary
        return want

    async def _read(self, answer: aiohttp.ClientResponse) -> bytes:
        chunks: list[bytes] = []
        total = 0
        async for chunk in answer.content.iter_any():
            total += len(chunk)
            if total > self.max_answer_bytes:
                raise _TooLargeError
            chunks.append(chunk)
        return b"".join(chunks)

    def _count(self, outcome: str, latency_s: float | None, url: str) -> None:
        if url != self.url:  # reconfigured while it ran: the old canary's, not counted
            return
        self.counts[outcome] += 1
        self._outcome[outcome].inc()
        if latency_s is not None:
            self.latencies.append(latency_s)

    def stats(self) -> dict[str, Any]:
        """What ``/status`` reports (``canary``)."""
        latencies = sorted(self.latencies)
        p99 = latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)] if latencies else None
        return {
            "url": self.url,
            "id": self.ident,
            "percent": self.percent,
            "requests": sum(self.counts.values()),
            **self.counts,
            "p99Ms": round(p99 * 1000.0, 3) if p99 is not None else None,
            "window": len(latencies),
        }

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def parse_canary(raw: bytes) -> tuple[str | None, int, str]:
    """``(url, percent, id)`` from a ``POST /admin/canary`` body; ValueError with one line."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ValueError('the body must be JSON: {"url": ..., "percent": 0..100}') from None
    if not isinstance(doc, dict) or set(doc) - {"url", "percent", "id"}:
        raise ValueError('expected {"url": ..., "percent": 0..100} and nothing else')
    percent = doc.get("percent", 0)
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise ValueError(f"percent must be an integer in 0..100, got {percent!r}")
    url = doc.get("url")
    if url is not None and (
        not isinstance(url, str)
        or len(url) > MAX_URL
        or not url.startswith(("http://", "https://"))
    ):
        raise ValueError("url must be an http(s) URL of at most 2048 characters")
    if percent > 0 and url is None:
        raise ValueError("a percent above 0 needs a url")
    ident = doc.get("id", "")
    if not isinstance(ident, str) or len(ident) > 64:
        raise ValueError("id must be a string of at most 64 characters")
    return url, percent, ident


def canary_routes(split: CanarySplit, token: AdminToken) -> list[web.RouteDef]:
    """``POST /admin/canary`` (bearer ``token``, or a token a rotating token file accepts
    now), or nothing when there is no token."""
    if not token:
        return []

    async def handle(request: web.Request) -> web.Response:
        if not bearer_accepted(request.headers.get("Authorization", ""), token):
            return web.json_response(
                {"code": 401, "message": "a valid bearer token is required"}, status=401
            )
        length = request.content_length
        if length is None or length > MAX_BODY:
            return web.json_response(
                {"code": 413, "message": f"at most {MAX_BODY} bytes"}, status=413
            )
        try:
            url, percent, ident = parse_canary(await request.read())
        except ValueError as exc:
            return web.json_response({"code": 400, "message": str(exc)}, status=400)
        split.configure(url, percent, ident)
        return web.json_response(split.stats())

    return [web.post("/admin/canary", handle)]
