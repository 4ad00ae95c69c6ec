"""The one client for every request the operator makes to serving and router pods.

A pod runs an image the PackratModel's author chose, so everything it answers is untrusted
input, and how it answers too: it may drip its headers one byte at a time, send a body of
gigabytes, redirect to an internal address, accept and never answer, or answer ``Infinity``,
a 400-digit number or a list where an object belongs. Every reader (the batch-size
estimates, the arrivals, the routers' latency histograms) and the in-pod plan poster go
through :class:`PodFanout`, which gives each request:

- a **total deadline**, not a per-read timeout: connecting, waiting for a slot, the headers
  and the body together (``asyncio.timeout``), so a pod that drips one byte every second
  holds nothing past it;
- **byte caps**: at most ``max_bytes`` of body (a larger ``Content-Length`` is refused before
  reading), at most 32 headers of 4 KiB, no transparent decompression;
- **no redirects** (a 3xx is an answer, never followed), no proxies from the environment, no
  cookies;
- a **bounded pool no set of models can monopolise**: at most ``per_owner`` requests in
  flight for one model; of those, the first ``floor`` are the model's own share, outside the
  shared pool, and the rest come from a pool of ``total`` for the whole operator. A model with
  many hostile pods queues behind its own cap (and gives up at its deadline); any number of
  such models can empty the shared pool, but never another model's share (issue 38: with the
  pool alone, 9 models blackholing their plan posts left a tenth's reads at 0 of 4).

The requests run on one event loop in one thread (aiohttp, which kopf already brings): a
request waiting on a slow pod costs a few KiB, not a thread. Callers block on the answer for
at most the deadline (plus a small margin), so everything a reconcile pass waits for is
bounded. :func:`read_json` parses an answer strictly (finite numbers, integers of at most
``MAX_DIGITS`` digits, bounded nesting); the readers then check each value's type and range.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

TOTAL_IN_FLIGHT = 64
PER_OWNER_IN_FLIGHT = 8
OWN_SHARE = 4  # of a model's requests in flight, the ones outside the shared pool
MAX_DIGITS = 30  # an integer with more digits is not a value any pod reports
MAX_HEADERS = 32
MAX_HEADER_BYTES = 4096
_MARGIN_SECONDS = 1.0  # the caller's own wait beyond the requests' deadline


@dataclass(frozen=True, slots=True)
class Answer:
    """One pod's answer: ``status`` 0 when there was none (unreachable, past the deadline,
    not plain http); ``error`` says why (also for an answer whose body was larger than
    allowed: its status, no body)."""

    status: int
    body: bytes = b""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a pod may report")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} is not finite")
    return value


def read_json(answer: Answer, *, any_status: bool = False) -> Any | None:
    """The JSON document of a 200 answer (of any answer with ``any_status``), strictly: None
    for anything else (no answer, not JSON, ``NaN``/``Infinity``, numbers that overflow,
    integers longer than ``MAX_DIGITS`` digits, nesting too deep)."""
    if not (answer.ok or (any_status and answer.status and answer.body)):
        return None
    try:
        return json.loads(
            answer.body,
            parse_constant=_reject_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None


def plain_http(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and bool(parts.hostname)


@dataclass(frozen=True, slots=True)
class _Call:
    """One fan-out: the same request to every URL."""

    owner: str
    method: str
    body: bytes | None
    headers: Mapping[str, str]
    deadline: float
    max_bytes: int


@dataclass(frozen=True, slots=True)
class _Owner:
    """One model's caps: all its requests in flight (``slots``) and its own share (``share``)."""

    slots: asyncio.Semaphore
    share: asyncio.Semaphore


class PodFanout:
    """Requests to many pods at once, each under a total deadline, within a global and a
    per-owner (per-model) concurrency cap. Thread-safe; one per operator."""

    def __init__(
        self,
        *,
        total: int = TOTAL_IN_FLIGHT,
        per_owner: int = PER_OWNER_IN_FLIGHT,
        floor: int = OWN_SHARE,
    ) -> None:
        self.total = total
        self.per_owner = per_owner
        self.floor = min(floor, per_owner)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pod-fanout", daemon=True
        )
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._global: asyncio.Semaphore | None = None
        self._owners: dict[str, tuple[_Owner, int]] = {}

    # -- the callers' side (any thread) -----------------------------------------------------
    def get(
        self,
        owner: str,
        urls: Sequence[str],
        *,
        deadline: float,
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
    ) -> list[Answer]:
        """``GET`` every URL at once (with ``headers``: the admin token for ``/arrivals``);
        the answers in the order of ``urls``."""
        return self._wait(_Call(owner, "GET", None, dict(headers or {}), deadline, max_bytes), urls)

    def post(
        self,
        owner: str,
        urls: Sequence[str],
        body: bytes,
        headers: Mapping[str, str],
        *,
        deadline: float,
        max_bytes: int,
    ) -> list[Answer]:
        """``POST`` ``body`` to every URL at once; the answers in the order of ``urls``."""
        return self._wait(_Call(owner, "POST", body, dict(headers), deadline, max_bytes), urls)

    def _wait(self, call: _Call, urls: Sequence[str]) -> list[Answer]:
        """``call`` to every URL, waited on (a "deadline" answer each past its deadline)."""
        if not urls:
            return []
        future = self._start(call, urls)
        try:
            return future.result(timeout=call.deadline + _MARGIN_SECONDS)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            future.cancel()
            return [Answer(0, error="deadline") for _ in urls]

    def submit(
        self,
        owner: str,
        method: str,
        urls: Sequence[str],
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        deadline: float,
        max_bytes: int,
    ) -> concurrent.futures.Future[list[Answer]]:
        """The same requests, without waiting: a future of the answers (in the order of
        ``urls``), done within ``deadline`` whatever the pods do (each request's wait for a
        slot counts in its deadline). Cancelling it cancels the requests. For a caller that
        must not block on the pods (the in-pod switch's plan post, picked up by a later
        pass)."""
        return self._start(_Call(owner, method, body, dict(headers), deadline, max_bytes), urls)

    def _start(self, call: _Call, urls: Sequence[str]) -> concurrent.futures.Future[list[Answer]]:
        return asyncio.run_coroutine_threadsafe(self._all(call, list(urls)), self._loop)

    def close(self) -> None:
        async def stop() -> None:
            if self._session is not None:
                await self._session.close()

        if self._loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    # -- the loop's side ----------------------------------------------------------------------
    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._global = asyncio.Semaphore(self.total)
            # no connection cap of its own: the owners' caps and the shared pool bound it
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                max_line_size=MAX_HEADER_BYTES,
                max_field_size=MAX_HEADER_BYTES,
                max_headers=MAX_HEADERS,
            )
        return self._session

    async def _all(self, call: _Call, urls: list[str]) -> list[Answer]:
        session = self._ensure_session()
        owner = self._acquire_owner(call.owner)
        try:
            return list(await asyncio.gather(*(self._one(session, owner, call, u) for u in urls)))
        finally:
            self._release_owner(call.owner)

    def _acquire_owner(self, name: str) -> _Owner:
        owner, users = self._owners.get(name, (None, 0))
        if owner is None:
            owner = _Owner(asyncio.Semaphore(self.per_owner), asyncio.Semaphore(self.floor))
        self._owners[name] = (owner, users + 1)
        return owner

    def _release_owner(self, name: str) -> None:
        owner, users = self._owners[name]
        if users <= 1:
            del self._owners[name]  # nothing kept for models that stopped asking
        else:
            self._owners[name] = (owner, users - 1)

    async def _one(
        self,
        session: aiohttp.ClientSession,
        owner: _Owner,
        call: _Call,
        url: str,
    ) -> Answer:
        if not plain_http(url):
            return Answer(0, error=f"not a plain http address: {url}"[:300])
        assert self._global is not None
        try:
            async with asyncio.timeout(call.deadline), owner.slots:
                # the model's own share first (taken at once when free: one event loop),
                # else a slot of the shared pool
                pool = owner.share if not owner.share.locked() else self._global
                async with pool:
                    return await self._request(session, call, url)
        except TimeoutError:
            return Answer(0, error=f"no answer within {call.deadline:g}s")
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            logger.debug("%s %s: %s", call.method, url, exc)
            return Answer(0, error=f"unreachable: {type(exc).__name__}: {exc}"[:300])

    @staticmethod
    async def _request(session: aiohttp.ClientSession, call: _Call, url: str) -> Answer:
        max_bytes = call.max_bytes
        async with session.request(
            call.method, url, data=call.body, headers=dict(call.headers), allow_redirects=False
        ) as resp:
            too_large = f"answer larger than {max_bytes} bytes: body not read"
            if resp.content_length is not None and resp.content_length > max_bytes:
                return Answer(resp.status, b"", too_large)
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > max_bytes:
                    return Answer(resp.status, b"", too_large)
            return Answer(resp.status, bytes(data))


_SHARED: list[PodFanout] = []
_SHARED_LOCK = threading.Lock()


def shared_fanout() -> PodFanout:
    """The operator's one client (made on first use)."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(PodFanout())
            atexit.register(_SHARED[0].close)
        return _SHARED[0]
