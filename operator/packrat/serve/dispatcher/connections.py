"""Connection limits for the dispatcher's public port: a cap and a deadline for each head.

aiohttp closes a connection that stays idle past its keep-alive timeout, but a client that
sends its request line and headers a byte at a time is never idle and is held forever, and
nothing caps how many connections are open. This module adds both, around aiohttp's own
server classes:

- ``max_connections``: a connection beyond the cap is closed as soon as it is accepted
  (counted; the client sees a reset and retries elsewhere);
- ``header_timeout_s``: from the moment a connection opens, or the first byte of a new
  request on a kept-alive connection, the whole head must arrive within this time;
- ``keepalive_timeout_s``: an idle kept-alive connection is closed after this long (aiohttp's
  own timer);
- ``refused_hold_s``: how long a connection whose body was refused is held, unread, before it
  is closed (aiohttp's lingering time).
- ``max_per_client``: one client address holds at most this many ordinary connections, so one
  client cannot take the whole cap;
- ``probe_reserve``: connections beyond the cap kept for health probes (the kubelet's
  ``/ping`` and ``/healthz``): a connection that arrives when the ordinary ones are used up
  (or over its client's share) is admitted *probe-only*: its head must arrive within
  ``probe_head_timeout_s`` and be a GET of a probe path, it is answered with
  ``Connection: close``, and no client holds more than ``probe_reserve_per_client`` of them.
  1,100 idle connections from one client therefore cannot make ``/ping`` fail: the client
  holds its share, and the probes find room in the reserve. Nor can many clients together
  (issue 38: nine addresses reconnecting fast held the whole reserve with connections that
  never sent a head): when the reserve is full, a new connection takes the place of the
  oldest probe-only connection still waiting for its head, which is closed. A real probe
  sends its head at once and is answered; a place held by sending nothing is held only until
  the next connection arrives.

Body read deadlines are the dispatcher's: it reads the body itself, after admission, with
:func:`read_body` (at most the body limit, counted as it arrives when chunked).

:func:`refuse_body` is for a request answered without its body (413, 408, a broken body):
aiohttp would otherwise read and discard what the client keeps sending for its whole
lingering time, at loopback speed (a 60 MB upload, all of it, in 0.5 s of the event loop).
A refused connection stops reading instead: the socket buffers fill, TCP holds the client
back, the answer is sent, and the connection is closed ``refused_hold_s`` later. Holding
costs a socket and nothing else; it gives the client time to read the answer before the
close (with unread data, a reset), and a client that reconnects to send its body again can
cost the event loop one refusal per ``refused_hold_s``, not one per round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler

__all__ = [
    "BodyRefusedError",
    "BodyTooLargeError",
    "BufferBudget",
    "ConnectionLimits",
    "GuardedAppRunner",
    "read_body",
    "receive_body",
    "refuse_body",
]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one dispatcher port allows each client connection."""

    max_connections: int = 1024
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 60.0
    refused_hold_s: float = 5.0
    max_per_client: int = 256
    probe_reserve: int = 32
    probe_reserve_per_client: int = 4
    probe_head_timeout_s: float = 2.0
    probe_paths: tuple[str, ...] = ("/ping", "/healthz")

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if self.probe_reserve < 0:
            raise ValueError("probe_reserve must be >= 0")
        if min(self.max_per_client, self.probe_reserve_per_client) < 1:
            raise ValueError("per-client limits must be >= 1")
        if self.probe_head_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        if min(self.header_timeout_s, self.keepalive_timeout_s, self.refused_hold_s) <= 0:
            raise ValueError("timeouts must be > 0")


class _GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol plus the connection cap and the head deadline."""

    def __init__(self, manager: _GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusing = False
        self._shielded = False  # the request in hand must run to completion (see shield)
        self._client = ""
        self._pool: str | None = None  # "ordinary" or "probe" once admitted

    def refuse_body(self) -> None:
        """Read no more of this connection: it closes after the answer (see the module)."""
        self._refusing = True
        self._pause_transport_reading()

    def _resume_transport_reading(self) -> None:
        # aiohttp's flow control resumes the transport once its buffers drain (as the
        # lingering close drains them); a refused connection stays paused.
        if not self._refusing:
            super()._resume_transport_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._pool = self._guard.admit(self._client, self)
        if self._pool is None:
            self._guard.on_event("refused")
            self.force_close()
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return
        if self._pool == "probe":
            self._probe_data(data)
            return
        # Idle (no request being handled or parsed) and bytes arrive: a new head starts.
        starting = (
            data
            and self._head_timer is None
            and not self._request_in_progress
            and not self._messages
        )
        super().data_received(data)
        if self._messages:
            self._disarm()  # the head is complete
        elif starting:
            # only a head that did not arrive whole gets a deadline: most arrive in one
            # segment, and a timer armed and cancelled per request costs the hot path
            self._arm()

    def _probe_data(self, data: bytes) -> None:
        """A probe-only connection: a GET of a probe path, answered and closed; else closed."""
        super().data_received(data)
        if not self._messages:
            return
        self._disarm()
        self._guard.heard(self)
        message = self._messages[0][0]
        if not (
            isinstance(message, RawRequestMessage)
            and message.method == "GET"
            and message.path in self._guard.limits.probe_paths
        ):
            self._messages.clear()
            self._guard.on_event("refused")
            self.force_close()
            if self.transport is not None:
                self.transport.close()
            return
        # answered with Connection: close: a probe slot is held for one probe only
        self._messages[0] = (message._replace(should_close=True), self._messages[0][1])

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.heard(self)
        if self._pool is not None:
            self._guard.release(self._client, self._pool)
            self._pool = None
        self._disarm()
        task = self._task_handler
        super().connection_lost(exc)  # aiohttp's own handler cancellation is off (see server)
        if self._guard.cancel_on_disconnect and task is not None and not self._shielded:
            task.cancel()

    def _arm(self) -> None:
        self._disarm()
        limits = self._guard.limits
        timeout = limits.probe_head_timeout_s if self._pool == "probe" else limits.header_timeout_s
        self._head_timer = self._loop.call_later(timeout, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._request_in_progress or self._messages:
            return
        # a probe-only connection that sent no probe was a connection over the cap
        self._guard.on_event("refused" if self._pool == "probe" else "header_timeout")
        self.force_close()
        if self.transport is not None:
            self.transport.close()


class _GuardedServer(web.Server):
    def __init__(
        self,
        handler: Any,
        *,
        limits: ConnectionLimits,
        on_event: Callable[[str], None],
        **kwargs: Any,
    ) -> None:
        # aiohttp cancels a disconnected client's handler wherever it is; this server does it
        # itself, unless the handler shielded its request (forwarded: it must finish, and
        # shielding it in a task of its own per request cost 10% of the dispatcher's CPU).
        self.cancel_on_disconnect = bool(kwargs.pop("handler_cancellation", False))
        super().__init__(handler, handler_cancellation=False, **kwargs)
        self.limits = limits
        self.on_event = on_event
        self.open = {"ordinary": 0, "probe": 0}
        self.by_client: dict[tuple[str, str], int] = {}
        # probe-only connections whose head has not arrived, oldest first
        self.waiting: dict[_GuardedHandler, None] = {}

    def admit(self, client: str, handler: _GuardedHandler) -> str | None:
        """The pool a new connection from ``client`` joins ("ordinary" or "probe"), or None
        (refused): ordinary up to the cap and the client's share, then probe-only, in the
        place of the oldest probe-only connection still silent when the reserve is full."""
        limits = self.limits
        pools = (
            ("ordinary", limits.max_connections, limits.max_per_client),
            ("probe", limits.probe_reserve, limits.probe_reserve_per_client),
        )
        for pool, total, share in pools:
            if self.by_client.get((client, pool), 0) >= share:
                continue
            if pool == "probe" and self.open[pool] >= total and self.waiting:
                self._evict(next(iter(self.waiting)))
            if self.open[pool] < total:
                self.open[pool] += 1
                self.by_client[(client, pool)] = self.by_client.get((client, pool), 0) + 1
                if pool == "probe":
                    self.waiting[handler] = None
                return pool
        return None

    def heard(self, handler: _GuardedHandler) -> None:
        """``handler``'s head arrived (or it closed): its place is no longer taken back."""
        self.waiting.pop(handler, None)

    def _evict(self, handler: _GuardedHandler) -> None:
        """Close a silent probe-only connection, its place given back at once."""
        self.waiting.pop(handler, None)
        if handler._pool is not None:
            self.release(handler._client, handler._pool)
            handler._pool = None
        self.on_event("refused")
        handler._disarm()
        handler.force_close()
        if handler.transport is not None:
            handler.transport.close()

    def release(self, client: str, pool: str) -> None:
        self.open[pool] -= 1
        left = self.by_client.get((client, pool), 1) - 1
        if left:
            self.by_client[(client, pool)] = left
        else:
            self.by_client.pop((client, pool), None)

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections obey :class:`ConnectionLimits`.

    ``on_event`` is called with ``"refused"`` (over the cap) or ``"header_timeout"``.
    """

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits,
        on_event: Callable[[str], None] = lambda _kind: None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("keepalive_timeout", limits.keepalive_timeout_s)
        kwargs.setdefault("lingering_time", limits.refused_hold_s)
        super().__init__(app, **kwargs)
        self.limits = limits
        self.on_event = on_event

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return _GuardedServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            limits=self.limits,
            on_event=self.on_event,
            **plain._kwargs,
        )


def shield(request: web.BaseRequest, on: bool) -> None:
    """While on, a disconnect of ``request``'s client does not cancel its handler: a request
    already forwarded runs to completion (its worker has it, its slot stays taken)."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol._shielded = on


def disconnected(request: web.BaseRequest) -> bool:
    """Whether ``request``'s client is gone (its answer has nobody to go to)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def refuse_body(request: web.BaseRequest) -> None:
    """Stop reading ``request``'s connection: the rest of its body is never read, and the
    connection closes once the answer is sent and the lingering time has passed."""
    protocol = request.protocol
    if isinstance(protocol, _GuardedHandler):
        protocol.refuse_body()


class BodyTooLargeError(Exception):
    """A chunked body went past the limit while it was read."""


async def read_body(request: web.BaseRequest, length: int | None, limit: int) -> bytes:
    """The body of ``request``: ``length`` bytes, or (chunked) what arrives up to ``limit``."""
    if length is not None:
        return await request.content.readexactly(length) if length else b""
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise BodyTooLargeError
        chunks.append(chunk)
    return b"".join(chunks)


class BodyRefusedError(Exception):
    """A request body that was not received whole: ``status`` (408, 413, 400) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def receive_body(
    request: web.BaseRequest, length: int | None, limit: int, timeout_s: float
) -> bytes:
    """The body of an admitted request, within ``timeout_s`` (unless it is all here already)
    and at most ``limit`` bytes; :class:`BodyRefusedError` otherwise. The caller answers the
    error with :func:`refuse_body`, so the rest of the body is never read."""
    try:
        if request.content.is_eof():  # all here already (a small body): no deadline
            return await read_body(request, length, limit)
        async with asyncio.timeout(timeout_s):  # no task, unlike wait_for
            return await read_body(request, length, limit)
    except TimeoutError:
        raise BodyRefusedError(408, "request body not received in time") from None
    except BodyTooLargeError:
        raise BodyRefusedError(413, "a longer body") from None
    except (aiohttp.ClientError, asyncio.IncompleteReadError, ConnectionError) as exc:
        raise BodyRefusedError(400, f"request body incomplete: {exc}") from None


class BufferBudget:
    """Bytes a server may hold in request (and answer) bodies at once, across all requests:
    one client's large bodies are shed (503) instead of growing the process to its limit."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a buffer budget needs at least 1 byte")
        self.limit = limit
        self.used = 0

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes if they fit (True); nothing taken otherwise."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n
