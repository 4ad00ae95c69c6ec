"""Issue 38: the operator's pod client gives every model a share that no number of hostile
models can take: 9 models whose pods blackhole their requests (more than the global cap's
worth) leave another model's reads answered, all of them. Real client, real sockets."""

from __future__ import annotations

import http.server
from collections.abc import Iterator

import http_support
import pytest

from packrat.controller.core.fanout import PER_OWNER_IN_FLIGHT, TOTAL_IN_FLIGHT, PodFanout


@pytest.fixture()
def blackhole() -> Iterator[str]:
    with http_support.blackhole(backlog=256) as url:
        yield url


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
    with http_support.serve_http(_Status) as url:
        yield url


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
