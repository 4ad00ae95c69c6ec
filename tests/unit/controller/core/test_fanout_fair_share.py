"""Issue 38: the operator's pod client gives every model a share that no number of hostile
models can take: 9 models whose pods blackhole their requests (more than the global cap's
worth) leave another model's reads answered, all of them. Real client, real sockets."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from packrat.controller.core.fanout import PER_OWNER_IN_FLIGHT, TOTAL_IN_FLIGHT, PodFanout


@pytest.fixture()
def blackhole() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
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


class _Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def healthy() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_hostile_models_cannot_take_another_models_share(blackhole: str, healthy: str) -> None:
    hostile = TOTAL_IN_FLIGHT // PER_OWNER_IN_FLIGHT + 1  # 9: more than the global cap
    fanout = PodFanout()
    try:
        posts = [
            fanout.submit(
                f"ns/hostile-{i}",
                "POST",
                [f"{blackhole}/admin/plan"] * PER_OWNER_IN_FLIGHT,
                b"{}",
                {},
                deadline=30.0,
                max_bytes=1024,
            )
            for i in range(hostile)
        ]
        answers = fanout.get("ns/good", [f"{healthy}/status"] * 4, deadline=5.0, max_bytes=1024)
        assert [a.status for a in answers] == [200] * 4, answers
        for post in posts:
            post.cancel()
    finally:
        fanout.close()
