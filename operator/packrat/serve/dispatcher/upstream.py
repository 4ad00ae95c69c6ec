"""The dispatcher's side towards TorchServe: one pooled HTTP session, and the proxying rules.

Bodies, content types and status codes pass through unchanged; hop-by-hop headers (RFC 9110
section 7.6.1) and the ones aiohttp recomputes (length, encoding, host) do not. When an
instance cannot be reached the client gets a 503 whose message names no internal address:
clients see the public port only. :func:`error_response` shapes the dispatcher's own answers
like TorchServe's (``code``, ``type``, ``message``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

import aiohttp
from aiohttp import web

__all__ = ["HOP_HEADERS", "Upstream", "error_response", "passthrough"]

log = logging.getLogger(__name__)

HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Content-Length",
        "Content-Encoding",
        "Host",
    )
)

_KINDS = {
    400: "BadRequestException",
    404: "ModelNotFoundException",
    408: "RequestTimeoutException",
    413: "RequestEntityTooLargeException",
    503: "ServiceUnavailableException",
}


def error_response(status: int, message: str, **headers: str) -> web.Response:
    """An error body shaped like TorchServe's own (``code``, ``type``, ``message``)."""
    kind = _KINDS.get(status, "InternalServerException")
    return web.Response(
        status=status,
        text=json.dumps({"code": status, "type": kind, "message": message}),
        content_type="application/json",
        headers=headers,
    )


def passthrough(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The end-to-end headers of ``headers`` (``items()`` of a header mapping)."""
    return {k: v for k, v in headers if k.lower() not in HOP_HEADERS}


class Upstream:
    """A pooled session to TorchServe's inference API at ``base_url``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        """POST ``body`` to registration ``name``; its answer, or a 503 when unreachable."""
        assert self._session is not None, "upstream not started"
        url = f"{self.base_url}/predictions/{name}"
        try:
            async with self._session.post(
                url, data=body, headers=headers, params=query
            ) as upstream:
                payload = await upstream.read()
                out = passthrough(upstream.headers.items())
                return web.Response(status=upstream.status, body=payload, headers=out)
        except aiohttp.ClientError as exc:
            log.warning("instance %s unreachable: %s", name, exc)
            return error_response(503, "instance unreachable", **{"Retry-After": "1"})
