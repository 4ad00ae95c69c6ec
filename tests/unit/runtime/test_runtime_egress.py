"""Issue 26, item 2: the operator's fetches for model authors against hostile listeners on
loopback (SSRF, redirects, port scanning, credential exfiltration, drip, blackhole, huge
bodies), through the same calls the operator's version check and ``packrat fetch`` make."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_support import Listener, answer, drip, endless

from packrat.runtime.egress import EgressPolicy
from packrat.runtime.fetch import FetchError, FetchLimits, _classify, fetch, object_version

LOOPBACK = EgressPolicy.parse(["127.0.0.0/8"])
OPEN = FetchLimits(policy=LOOPBACK, timeout_s=20.0)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def internal() -> Iterator[Listener]:
    """An 'internal service': answers with an ETag that must never be reflected anywhere."""
    listener = Listener(answer("200 OK", {"ETag": '"internal-secret"', "Content-Length": "0"}))
    yield listener
    listener.close()


def _reason(call: object) -> FetchError:
    with pytest.raises(FetchError) as err:
        call()  # type: ignore[operator]
    return err.value


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "169.254.169.254",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ],
)
def test_internal_addresses_are_refused_by_default(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert not EgressPolicy().allows_address(ip)
    assert EgressPolicy.parse(["0.0.0.0/0", "::/0"]).allows_address(ip)
    assert EgressPolicy().allows_address(ipaddress.ip_address("93.184.215.14"))


def test_the_version_check_never_reaches_an_internal_target(internal: Listener) -> None:
    err = _reason(lambda: object_version(f"{internal.url}/model.pt", {}))
    assert err.reason == "Unreachable"
    assert "internal-secret" not in str(err)
    assert internal.connections == 0  # refused before connecting
    # a name is resolved and every address checked: localhost is loopback too
    err = _reason(lambda: object_version(f"http://localhost:{internal.port}/model.pt", {}))
    assert err.reason == "Unreachable" and internal.connections == 0
    # allowed explicitly (an in-cluster store), the same target answers
    assert object_version(f"{internal.url}/model.pt", {}, limits=OPEN) == '"internal-secret"'


def test_a_closed_port_and_a_refused_address_read_the_same(internal: Listener) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    allowed_but_closed = _reason(
        lambda: object_version(f"http://127.0.0.1:{port}/m.pt", {}, limits=OPEN)
    )
    refused_but_open = _reason(lambda: object_version(f"{internal.url}/m.pt", {}))
    assert allowed_but_closed.reason == refused_but_open.reason == "Unreachable"
    same = allowed_but_closed.message.replace(str(port), "PORT")
    assert same == refused_but_open.message.replace(str(internal.port), "PORT")


def test_redirects_are_not_followed(internal: Listener, tmp_path: Path) -> None:
    redirector = Listener(
        answer("302 Found", {"Location": f"{internal.url}/x", "Content-Length": "0"})
    )
    try:
        err = _reason(lambda: object_version(f"{redirector.url}/m.pt", {}, limits=OPEN))
        assert err.reason == "Redirected" and "internal-secret" not in str(err)
        err = _reason(
            lambda: fetch(f"{redirector.url}/m.pt", tmp_path / "m", credentials={}, limits=OPEN)
        )
        assert err.reason == "Redirected"
        assert internal.connections == 0 and list(tmp_path.iterdir()) == []
    finally:
        redirector.close()


def test_authorization_goes_only_to_the_host_the_secret_names() -> None:
    store = Listener(answer("200 OK", {"ETag": '"v1"', "Content-Length": "0"}))
    try:
        uri = f"{store.url}/m.pt"
        # an author points a Secret they can reference (but not read) at their own host
        for creds in (
            {"AUTHORIZATION": "Bearer stolen"},
            {"AUTHORIZATION": "Bearer stolen", "AUTHORIZATION_HOST": "models.example.com"},
        ):
            err = _reason(lambda c=creds: object_version(uri, c, limits=OPEN))
            assert err.reason == "AccessDenied" and "stolen" not in str(err)
        assert store.connections == 0
        ok = {"AUTHORIZATION": "Bearer good", "AUTHORIZATION_HOST": "127.0.0.1"}
        assert object_version(uri, ok, limits=OPEN) == '"v1"'
        assert b"authorization: bearer good" in store.heads[-1].lower()
    finally:
        store.close()


def test_a_dripping_server_is_cut_at_the_total_deadline(
    stop: threading.Event, tmp_path: Path
) -> None:
    # a whole valid answer, one byte every 50 ms (about 8 s): each read succeeds in time
    body = b"x" * 64
    payload = b'HTTP/1.1 200 OK\r\nContent-Length: 64\r\nETag: "v"\r\n\r\n' + body
    listener = Listener(drip(payload, 0.05, stop))
    limits = FetchLimits(policy=LOOPBACK, timeout_s=1.0)
    try:
        err = _reason(lambda: object_version(f"{listener.url}/m.pt", {}, limits=limits))
        assert err.reason == "Unreachable"
        err = _reason(
            lambda: fetch(f"{listener.url}/m.pt", tmp_path / "m", credentials={}, limits=limits)
        )
        assert err.reason == "Unreachable" and list(tmp_path.iterdir()) == []
    finally:
        listener.close()


def test_a_blackhole_is_cut_at_the_total_deadline() -> None:
    hole = Listener(answer("200 OK", {}), accept=False)  # connects, never answers
    try:
        limits = FetchLimits(policy=LOOPBACK, timeout_s=1.0)
        err = _reason(lambda: object_version(f"{hole.url}/m.pt", {}, limits=limits))
        assert err.reason == "Unreachable"
    finally:
        hole.close()


def test_an_endless_body_stops_at_the_byte_cap(stop: threading.Event, tmp_path: Path) -> None:
    limits = FetchLimits(policy=LOOPBACK, timeout_s=60.0, max_bytes=4 << 20)
    for headers in ({}, {"Content-Length": str(1 << 40)}):
        listener = Listener(endless(headers, stop))
        try:
            err = _reason(
                lambda u=listener.url: fetch(
                    f"{u}/m.pt", tmp_path / "m", credentials={}, limits=limits
                )
            )
            assert err.reason == "TooLarge", err
            assert list(tmp_path.iterdir()) == []
        finally:
            listener.close()


def test_an_s3_endpoint_is_checked_too_and_bounded_in_total(internal: Listener) -> None:
    creds = {"AWS_ENDPOINT_URL": internal.url}
    err = _reason(lambda: object_version("s3://bucket/m.pt", creds))
    assert err.reason == "Unreachable" and internal.connections == 0
    # allowed, a store that never answers costs one deadline (retries included), not 182 s
    hole = Listener(answer("200 OK", {}), accept=False)
    try:
        limits = FetchLimits(policy=LOOPBACK, timeout_s=3.0, identity="none")
        err = _reason(
            lambda: object_version(
                "s3://bucket/m.pt", {"AWS_ENDPOINT_URL": hole.url}, limits=limits
            )
        )
        assert err.reason == "Unreachable"
    finally:
        hole.close()


@pytest.mark.timeout(60)
def test_store_errors_never_copy_what_the_store_sent() -> None:
    body = b"<Error><Code>InternalError</Code><Message>internal-secret</Message></Error>"
    store = Listener(answer("500 Internal Server Error", {"Content-Length": str(len(body))}, body))
    try:
        limits = FetchLimits(policy=LOOPBACK, timeout_s=10.0, identity="none")
        for uri, creds in (
            ("s3://bucket/m.pt", {"AWS_ENDPOINT_URL": store.url}),
            (f"{store.url}/m.pt", {}),
        ):
            err = _reason(lambda u=uri, c=creds: object_version(u, c, limits=limits))
            assert err.reason == "Unreachable" and "internal-secret" not in str(err)
    finally:
        store.close()


@pytest.mark.parametrize("port", [40412, 40301, 8404])
def test_a_port_that_looks_like_a_status_is_not_one(port: int) -> None:
    # a store's 500 on a port with 404 or 403 in it was read as NotFound or AccessDenied
    # (seen once in a full run: the listener's free port was 404xx)
    err = RuntimeError(f"Generic HTTP error: http://127.0.0.1:{port}/m.pt: 500 Internal Error")
    assert _classify("s3://bucket/m.pt", err).reason == "Unreachable"
    assert _classify("s3://b/m.pt", RuntimeError("HTTP status 404 Not Found")).reason == "NotFound"
    assert _classify("s3://b/m.pt", RuntimeError("status 403: denied")).reason == "AccessDenied"


def test_the_storage_host_allow_list() -> None:
    policy = EgressPolicy.parse(["127.0.0.0/8"], ["models.example.com", ".corp.example"])
    limits = FetchLimits(policy=policy, timeout_s=5.0)
    err = _reason(lambda: object_version("http://127.0.0.1:9/m.pt", {}, limits=limits))
    assert err.reason == "HostNotAllowed"
    err = _reason(
        lambda: object_version(
            "s3://b/m.pt", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, limits=limits
        )
    )
    assert err.reason == "HostNotAllowed"
    with pytest.raises(ValueError, match="CIDR"):
        EgressPolicy.parse(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="host"):
        EgressPolicy.parse([], ["http://x"])


def test_through_the_platforms_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where stores are reached only through an HTTP proxy, the proxy resolves the name (a
    name this machine cannot resolve still works); literal internal addresses and hosts off
    the allow-list are still refused."""
    proxy = Listener(answer("200 OK", {"ETag": '"via-proxy"', "Content-Length": "0"}))
    try:
        for var in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(var, proxy.url)
        for var in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(var, raising=False)
        limits = FetchLimits(timeout_s=10.0)
        assert object_version("http://models.invalid/m.pt", {}, limits=limits) == '"via-proxy"'
        assert proxy.heads[-1].startswith(b"HEAD http://models.invalid/m.pt HTTP/1.1")
        seen = proxy.connections
        err = _reason(lambda: object_version("http://169.254.169.254/latest", {}, limits=limits))
        assert err.reason == "Unreachable" and proxy.connections == seen
        only = FetchLimits(policy=EgressPolicy.parse([], ["models.example.com"]), timeout_s=10.0)
        err = _reason(lambda: object_version("http://models.invalid/m.pt", {}, limits=only))
        assert err.reason == "HostNotAllowed"
    finally:
        proxy.close()
