"""A credentials Secret's Authorization goes only to the host its AUTHORIZATION_HOST names,
whatever the URL's authority hides (issue 38: ``http://ATTACKER?@models.example.com/m.pt``).

The check and the request read the host with one parser, and an authority with ``?``, ``#``,
``@`` or ``\\`` is refused before anything is sent. The "attacker" here is a real HTTP server on
loopback that records every Authorization header it is sent."""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from pathlib import Path

import http_support
import pytest

from packrat.runtime.egress import EgressError, EgressPolicy, request, split_url
from packrat.runtime.fetch import FetchError, FetchLimits, fetch, object_version

LOOPBACK = FetchLimits(policy=EgressPolicy.parse(["127.0.0.0/8"]), timeout_s=10.0)
SECRET = {"AUTHORIZATION": "Bearer s3cr3t", "AUTHORIZATION_HOST": "models.example.com"}
SEEN: list[str] = []


class _Attacker(http.server.BaseHTTPRequestHandler):
    def _record(self) -> None:
        SEEN.append(self.headers.get("Authorization") or "")
        self.send_response(200)
        self.send_header("Content-Length", "1")
        self.end_headers()

    def do_GET(self) -> None:
        self._record()
        self.wfile.write(b"x")

    def do_HEAD(self) -> None:
        self._record()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def attacker() -> Iterator[str]:
    with http_support.serve_http(_Attacker) as url:
        yield url.removeprefix("http://")


HIDDEN = ("?@models.example.com/m.pt", "#@models.example.com/m.pt", "\\@models.example.com/m.pt")


@pytest.mark.parametrize("tail", HIDDEN)
def test_a_hidden_authority_gets_no_credentials(attacker: str, tail: str, tmp_path: Path) -> None:
    SEEN.clear()
    uri = f"http://{attacker}{tail}"
    with pytest.raises(FetchError) as err:
        fetch(uri, tmp_path / "m.pt", credentials=SECRET, limits=LOOPBACK)
    assert err.value.reason == "BadUri", err.value
    with pytest.raises(FetchError) as err:
        object_version(uri, SECRET, limits=LOOPBACK)
    assert err.value.reason == "BadUri", err.value
    assert SEEN == []  # nothing at all reached the host the request would have gone to


@pytest.mark.parametrize(
    "url",
    [
        "http://a?@b/x",
        "http://a#@b/x",
        "http://a\\@b/x",
        "http://user:pw@b/x",
        "http://b/x\n",
        "http://b x/y",
        "http://[::1/x",
        "http://b:99999/x",
        "ftp://b/x",
    ],
)
def test_the_one_parser_refuses_ambiguous_authorities(url: str) -> None:
    with pytest.raises(EgressError) as err:
        split_url(url)
    assert err.value.reason == "BadUri"
    with pytest.raises(EgressError):
        request("GET", url, policy=EgressPolicy(), timeout_s=1.0)


def test_the_one_parser_reads_what_the_request_uses() -> None:
    parts = split_url("https://Models.Example.com:8443/a/m.pt?x=1#frag")
    assert (parts.scheme, parts.host, parts.port) == ("https", "models.example.com", 8443)
    assert parts.target == "/a/m.pt?x=1"
    assert split_url("http://[::1]/m.pt").host == "::1"
    assert split_url("http://h").target == "/"
