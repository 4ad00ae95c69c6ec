"""The message framing of the fork servers' Unix sockets, written once.

Both fork servers (:mod:`packrat.runtime.forkserver`, and the pod's zygote,
:mod:`packrat.serve.zygote.zygote`, with the pod's side in :mod:`packrat.serve.zygote.process`)
speak it: a 4-byte big-endian length, then that many bytes of one JSON object; file descriptors
travel with the first bytes (``SCM_RIGHTS``). A message is at most :data:`MAX_MESSAGE` bytes.
(TorchServe's worker launcher writes the same frame by hand: it imports nothing of Packrat.)
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

MAX_MESSAGE = 1 << 20


def send_message(sock: socket.socket, obj: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """Send ``obj`` as one frame, with ``fds`` passed along."""
    body = json.dumps(obj).encode()
    data = len(body).to_bytes(4, "big") + body
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def recv_message(sock: socket.socket, *, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One frame's JSON object and the descriptors that came with it (at most ``max_fds``);
    ConnectionError when the other side closed, ValueError for a frame that is not one."""
    data, fds, _, _ = socket.recv_fds(sock, 4 + MAX_MESSAGE, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("the other side closed the channel")
    size = int.from_bytes(data[:4], "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    body = data[4:]
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the other side closed the channel mid-message")
        body += chunk
    msg = json.loads(body)
    if not isinstance(msg, dict):
        raise ValueError("expected a JSON object")
    return msg, list(fds)
