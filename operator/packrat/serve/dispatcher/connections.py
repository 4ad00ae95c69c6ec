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

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["BodyTooLargeError", "ConnectionLimits", "GuardedAppRunner", "read_body", "refuse_body"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one dispatcher port allows each client connection."""

    max_connections: int = 1024
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 60.0
    refused_hold_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
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
        if len(self._guard.connections) > self._guard.limits.max_connections:
            self._guard.on_event("refused")
            self.force_close()
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
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

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        task = self._task_handler
        super().connection_lost(exc)  # aiohttp's own handler cancellation is off (see server)
        if self._guard.cancel_on_disconnect and task is not None and not self._shielded:
            task.cancel()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self._loop.call_later(
            self._guard.limits.header_timeout_s, self._head_expired
        )

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._request_in_progress or self._messages:
            return
        self._guard.on_event("header_timeout")
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
