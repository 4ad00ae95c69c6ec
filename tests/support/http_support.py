"""Loopback HTTP peers for the unit tests: a real ``http.server`` on a thread, and a
"blackhole" that accepts connections and never answers. Context managers yielding the base URL;
the tests wrap them in fixtures."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on 127.0.0.1 (a free port) until the block ends: ``http://host:port``."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def blackhole(backlog: int = 256) -> Iterator[str]:
    """A peer that accepts every connection and never answers: ``http://host:port``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
