"""Hostile listeners on loopback for the boundary tests: each accepts connections and answers
(or does not) the way an attacker's server would. One thread per listener; ``close()`` ends it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

Behaviour = Callable[[socket.socket, bytes], None]


class Listener:
    """A TCP listener on 127.0.0.1 that runs ``behaviour(conn, head)`` for each connection
    (``head``: what the client sent before its first blank line, up to 64 KiB)."""

    def __init__(self, behaviour: Behaviour, *, accept: bool = True) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.heads: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        if accept:  # a blackhole never accepts: connections wait in the backlog
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = conn.recv(4096)
                if not data:
                    break
                head += data
            self.heads.append(head)
            self.behaviour(conn, head)
        with contextlib.suppress(OSError):
            conn.close()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        for conn in [self.sock, *self._open]:
            with contextlib.suppress(OSError):
                conn.close()


def answer(status: str, headers: dict[str, str], body: bytes = b"") -> Behaviour:
    def run(conn: socket.socket, head: bytes) -> None:
        lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items())]
        conn.sendall("\r\n".join([*lines, "Connection: close", "", ""]).encode() + body)

    return run


def drip(payload: bytes, every_s: float, stop: threading.Event) -> Behaviour:
    """Send ``payload`` (a whole valid answer) one byte per ``every_s``."""

    def run(conn: socket.socket, head: bytes) -> None:
        for i in range(len(payload)):
            if stop.wait(every_s):
                return
            conn.sendall(payload[i : i + 1])

    return run


def endless(headers: dict[str, str], stop: threading.Event) -> Behaviour:
    """A 200 whose body never ends (1 MiB chunks until the client goes away)."""

    def run(conn: socket.socket, head: bytes) -> None:
        lines = ["HTTP/1.1 200 OK", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        conn.sendall("\r\n".join(lines).encode())
        chunk = b"\0" * (1 << 20)
        while not stop.is_set():
            conn.sendall(chunk)

    return run
