"""The native runtime's wire format between the pod and one worker, over a stream socket.

Every message is one frame: a 4-byte big-endian length, then the payload, whose first byte
says what it is:

- ``BATCH`` (pod -> worker): batch id, then each request's content type and body;
- ``REPLY`` (worker -> pod): the batch id, then each request's status, content type and body,
  in the batch's order;
- ``HELLO`` (worker -> pod, once): JSON ``{"pid": ..., "ok": true}`` when the worker is loaded,
  or ``{"ok": false, "error": "..."}`` before it exits.

Frames are bounded (:data:`MAX_FRAME`): a reader refuses a longer one as a broken peer, so a
worker that goes wrong cannot make the pod buffer without bound. Pure: bytes in, bytes out;
the pod reads with asyncio, the worker with a blocking socket.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BATCH",
    "HELLO",
    "MAX_FRAME",
    "REPLY",
    "Item",
    "ProtocolError",
    "Result",
    "decode_batch",
    "decode_hello",
    "decode_reply",
    "encode_batch",
    "encode_hello",
    "encode_reply",
    "frame_length",
    "recv_frame",
    "send_frame",
]

BATCH, REPLY, HELLO = 1, 2, 3
MAX_FRAME = 512 * 1024 * 1024  # a batch of 64 bodies of 6 MiB fits; the dispatcher caps less
_LEN = struct.Struct("!I")
_HEAD = struct.Struct("!BIH")  # kind, batch id, count
_ITEM = struct.Struct("!HI")  # content type length, body length
_RESULT = struct.Struct("!HHI")  # status, content type length, body length


class ProtocolError(ValueError):
    """A frame that does not decode: the peer is broken."""


@dataclass(frozen=True, slots=True)
class Item:
    """One request of a batch."""

    content_type: str
    """The request's Content-Type; a frame carries at most 65535 bytes of it (UTF-8), the
    rest is cut."""
    body: bytes
    """The request's body, as the client sent it."""


@dataclass(frozen=True, slots=True)
class Result:
    """One request's answer."""

    status: int
    """The HTTP status code the pod answers the request with."""
    content_type: str
    """The answer's Content-Type, cut like :attr:`Item.content_type`."""
    body: bytes
    """The answer's body."""


def _framed(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"a frame of {len(payload)} bytes is over {MAX_FRAME}")
    return _LEN.pack(len(payload)) + payload


def frame_length(head: bytes) -> int:
    """The payload length a 4-byte frame head announces (refused beyond :data:`MAX_FRAME`)."""
    (length,) = _LEN.unpack(head)
    if length > MAX_FRAME or length < 1:
        raise ProtocolError(f"a frame of {length} bytes (at most {MAX_FRAME})")
    return int(length)


def encode_batch(batch_id: int, items: Sequence[Item]) -> bytes:
    parts = [_HEAD.pack(BATCH, batch_id, len(items))]
    for item in items:
        ctype = item.content_type.encode()[:0xFFFF]
        parts += [_ITEM.pack(len(ctype), len(item.body)), ctype, item.body]
    return _framed(b"".join(parts))


def encode_reply(batch_id: int, results: Sequence[Result]) -> bytes:
    parts = [_HEAD.pack(REPLY, batch_id, len(results))]
    for r in results:
        ctype = r.content_type.encode()[:0xFFFF]
        parts += [_RESULT.pack(r.status, len(ctype), len(r.body)), ctype, r.body]
    return _framed(b"".join(parts))


def encode_hello(doc: dict[str, Any]) -> bytes:
    return _framed(bytes([HELLO]) + json.dumps(doc).encode())


def _head(payload: bytes, kind: int) -> tuple[int, int, int]:
    if len(payload) < _HEAD.size or payload[0] != kind:
        raise ProtocolError(f"expected a frame of kind {kind}")
    _, batch_id, count = _HEAD.unpack_from(payload)
    return batch_id, count, _HEAD.size


def _take(payload: bytes, offset: int, length: int) -> tuple[bytes, int]:
    end = offset + length
    if end > len(payload):
        raise ProtocolError("a frame ends inside an item")
    return payload[offset:end], end


def decode_batch(payload: bytes) -> tuple[int, list[Item]]:
    batch_id, count, offset = _head(payload, BATCH)
    items = []
    for _ in range(count):
        head, offset = _take(payload, offset, _ITEM.size)
        clen, blen = _ITEM.unpack(head)
        ctype, offset = _take(payload, offset, clen)
        body, offset = _take(payload, offset, blen)
        items.append(Item(ctype.decode(errors="replace"), body))
    if offset != len(payload):
        raise ProtocolError("trailing bytes after a batch")
    return batch_id, items


def decode_reply(payload: bytes) -> tuple[int, list[Result]]:
    batch_id, count, offset = _head(payload, REPLY)
    results = []
    for _ in range(count):
        head, offset = _take(payload, offset, _RESULT.size)
        status, clen, blen = _RESULT.unpack(head)
        ctype, offset = _take(payload, offset, clen)
        body, offset = _take(payload, offset, blen)
        results.append(Result(status, ctype.decode(errors="replace"), body))
    if offset != len(payload):
        raise ProtocolError("trailing bytes after a reply")
    return batch_id, results


def decode_hello(payload: bytes) -> dict[str, Any]:
    if not payload or payload[0] != HELLO:
        raise ProtocolError("expected a hello frame")
    try:
        doc = json.loads(payload[1:])
    except ValueError as exc:
        raise ProtocolError(f"a hello that is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("a hello that is not a JSON object")
    return doc


# -- the worker's side: a blocking socket --------------------------------------------------------
def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(min(size - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes | None:
    """The next frame's payload, or None when the peer closed the socket."""
    head = _recv_exactly(sock, _LEN.size)
    if head is None:
        return None
    payload = _recv_exactly(sock, frame_length(head))
    if payload is None:
        return None
    return payload


def send_frame(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(frame)
