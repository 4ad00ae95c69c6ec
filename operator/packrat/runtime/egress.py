"""The egress policy for every request made on a model author's behalf, and the one HTTP client
that obeys it.

Two programs fetch what a model author names: the operator (the storageUri version check, a
HEAD) and ``packrat fetch`` (the init container, a GET). Both run with more reach than the author
has: the operator's network position and the credentials Secrets it mounts, the pod's network
position. Without a policy an author could point ``storageUri`` at the cloud's metadata service,
the API server or any internal port, and read back what the operator saw (a confused deputy).
So every outbound request for an author obeys one :class:`EgressPolicy`:

- the host's name is resolved once and **every** address it resolves to is checked; loopback,
  link-local (the metadata services), private, shared (100.64/10), unspecified, multicast and
  reserved addresses are refused unless a range in ``allow`` covers them (a chart value and a
  CLI flag: an in-cluster MinIO needs its Service range allowed). The connection then goes to
  an address that was checked (no second lookup that a rebinding DNS server could answer
  differently);
- ``hosts``, when set, is the operator's allow-list of storage hosts (``models.example.com``, or
  ``.example.com`` for any subdomain): no other host is asked at all;
- one total deadline per request (resolution, connection, head and body together), enforced by
  closing the socket when it passes, however slowly the peer drips;
- redirects are never followed; bodies are capped in bytes;
- through the platform's HTTP proxy (``HTTPS_PROXY``/``HTTP_PROXY``, not ``NO_PROXY``) the
  proxy resolves and connects, so only the allow-list and literal addresses are checked;
- a refused address, a closed port, an unanswered one and a name that does not resolve give the
  same :class:`EgressError` text, so the status of a model cannot be used as a port scanner (the
  detail goes to the log of the program that asked, for the platform team).

Object-store protocols (S3, GCS) run through obstore, whose HTTP client this module cannot
steer; :func:`check_endpoint` applies the same address checks to their endpoint before each call
(see :mod:`packrat.runtime.fetch`). The cloud's own credential endpoints (metadata services,
STS) are reached by obstore's credential providers, configured by the platform, never by a URL
an author wrote: they are not subject to this policy, and an author's URL may never name them.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, suppress
from dataclasses import dataclass

__all__ = [
    "CLUSTER_RANGES",
    "UNREACHABLE",
    "EgressError",
    "EgressPolicy",
    "HttpAnswer",
    "check_endpoint",
    "parse_networks",
    "request",
    "split_url",
]

logger = logging.getLogger(__name__)

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
UNREACHABLE = (
    "did not answer (refused, unreachable, no answer in time, or not allowed by the operator's "
    "egress policy)"
)
CHUNK = 1 << 20
# The cluster's own private ranges (Pods, Services): where an in-cluster receiver such as a
# Knative broker lives. Loopback, link-local (the metadata services), unspecified, multicast
# and reserved addresses are not among them.
CLUSTER_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
# getaddrinfo blocks without a timeout of its own: lookups run here, waited on with a deadline
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="egress-resolve")


class EgressError(Exception):
    """A request made for a model author failed; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# The authority of a URL made for a model author: a host name (letters, digits, ``.``, ``-``,
# ``_``) or a bracketed IPv6 address, and an optional port. Nothing else: no user info (``@``),
# and none of the characters that end an authority for one parser and not for another (``?``,
# ``#``, ``\``): ``http://ATTACKER?@models.example.com/`` is ATTACKER to urllib but
# models.example.com to a pattern reading up to the first ``/``. Everything up to the first
# ``/`` must be that authority (a stricter reading than RFC 3986's). The CRD's storageUri pattern
# and the operator's validation (:mod:`packrat.controller.core.storage`) say the same.
AUTHORITY_RE = re.compile(r"(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
_URL_RE = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<authority>[^/]*)(?P<rest>[^\s]*)")


@dataclass(frozen=True, slots=True)
class UrlParts:
    """An http(s) URL as the one parser reads it: who checks a host and who connects to it
    read the same ``host``."""

    scheme: str
    host: str  # lower case, IPv6 without brackets
    port: int
    target: str  # path and query, as sent in the request line (never the fragment)


def split_url(url: str, *, schemes: tuple[str, ...] = ("http", "https")) -> UrlParts:
    """The one parser for URLs requested for model authors (:class:`EgressError` ``BadUri``
    for anything ambiguous: see :data:`AUTHORITY_RE`; control characters and spaces anywhere)."""
    match = _URL_RE.fullmatch(url) if url.isascii() and url.isprintable() else None
    authority = AUTHORITY_RE.fullmatch(match.group("authority")) if match else None
    if match is None or authority is None or match.group("scheme") not in schemes:
        raise EgressError(
            "BadUri",
            f"{url[:200]!r} is not a {'/'.join(schemes)} URL with a plain host[:port] "
            "(no user info, '?', '#' or '\\' before the path)",
        )
    try:
        parts = urllib.parse.urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        hostname = None
    port = authority.group("port")
    if (port is not None and not 0 < int(port) < 65536) or hostname is None:
        raise EgressError("BadUri", f"{url[:200]!r}: not a valid host and port")
    default = 443 if parts.scheme == "https" else 80
    host = authority.group("host").strip("[]").lower()
    if hostname != host:  # the parsers agree, or nothing is sent
        raise EgressError("BadUri", f"{url[:200]!r}: an ambiguous host")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return UrlParts(parts.scheme, host, int(port) if port else default, target)


def parse_networks(values: Iterable[str]) -> tuple[IpNetwork, ...]:
    """CIDR ranges (``10.0.0.0/8``, ``fd00::/8``); ValueError naming the bad one."""
    out: list[IpNetwork] = []
    for value in values:
        text = value.strip()
        if not text:
            continue
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"not an address range (CIDR): {text!r}") from None
    return tuple(out)


def _internal(ip: IpAddress) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        return _internal(mapped)
    return not ip.is_global or ip.is_multicast or ip.is_reserved


def host_matches(host: str, patterns: Iterable[str]) -> bool:
    """Whether ``host`` is one of ``patterns`` (``.example.com`` matches any subdomain)."""
    host = host.lower().rstrip(".")
    for pattern in patterns:
        p = pattern.lower().rstrip(".")
        if (p.startswith(".") and host.endswith(p)) or host == p:
            return True
    return False


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which addresses and hosts requests made for model authors may reach (see the module)."""

    allow: tuple[IpNetwork, ...] = ()
    hosts: tuple[str, ...] = ()

    @classmethod
    def parse(cls, allow: Iterable[str] = (), hosts: Iterable[str] = ()) -> EgressPolicy:
        names = tuple(h.strip().lower() for h in hosts if h.strip())
        for h in names:
            if not h.lstrip(".") or any(c in h for c in "/:@ *"):
                raise ValueError(f"not a host name or .domain suffix: {h!r}")
        return cls(allow=parse_networks(allow), hosts=names)

    def flags(self) -> list[str]:
        """This policy as ``packrat fetch`` arguments (the init container obeys it too)."""
        out: list[str] = []
        for net in self.allow:
            out += ["--egress-allow", str(net)]
        for host in self.hosts:
            out += ["--storage-host", host]
        return out

    def allows_address(self, ip: IpAddress) -> bool:
        return not _internal(ip) or any(ip in net for net in self.allow)

    def check_host(self, host: str) -> None:
        """Refuse a host outside the allow-list (names only; addresses are checked later)."""
        if self.hosts and not host_matches(host, self.hosts):
            raise EgressError(
                "HostNotAllowed",
                f"{host} is not one of the storage hosts the operator allows "
                f"({', '.join(self.hosts)})",
            )

    def check_unresolved(self, host: str) -> None:
        """For a host reached through the platform's proxy (which resolves it): the allow-list,
        and the address itself when the host is one."""
        self.check_host(host)
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return
        if not self.allows_address(literal):
            raise _unreachable(host, "refused by the egress policy")

    def resolve(self, host: str, port: int, deadline: float) -> list[IpAddress]:
        """Every address of ``host``, each checked; :class:`EgressError` (UNREACHABLE) if any
        is refused or the name does not resolve before ``deadline`` (a monotonic time)."""
        self.check_host(host)
        try:
            literal: IpAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            future = _RESOLVER.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
            try:
                infos = future.result(timeout=max(deadline - time.monotonic(), 0.001))
            except (OSError, FutureTimeout, UnicodeError) as exc:
                raise _unreachable(host, f"resolving: {exc!r}") from None
            addresses = list(
                dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)
            )
        refused = [str(ip) for ip in addresses if not self.allows_address(ip)]
        if refused or not addresses:
            raise _unreachable(host, f"refused by the egress policy: {', '.join(refused)}")
        return addresses


def _unreachable(host: str, detail: str) -> EgressError:
    logger.debug("egress to %s failed: %s", host, detail)  # the detail stays in the log
    return EgressError("Unreachable", f"{host} {UNREACHABLE}")


def check_endpoint(url: str, policy: EgressPolicy, *, timeout_s: float) -> None:
    """Apply ``policy`` to the host of an object store's endpoint URL (obstore connects itself)."""
    parts = split_url(url)
    if proxy_for(url) is not None:
        policy.check_unresolved(parts.host)
        return
    policy.resolve(parts.host, parts.port, time.monotonic() + timeout_s)


def proxy_for(url: str) -> tuple[str, int] | None:
    """The platform's HTTP proxy for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``, ``NO_PROXY``),
    or None. Through a proxy the proxy resolves and connects: it is the egress control then,
    and only the allow-list and literal addresses are checked here."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    where = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not where.hostname:
        return None
    return where.hostname, where.port or 80


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    headers: Mapping[str, str]  # lower-case names


class _Pinned(http.client.HTTPConnection):
    """An HTTP connection over a socket already connected to a checked address."""

    def __init__(self, host: str, port: int, sock: socket.socket) -> None:
        super().__init__(host, port)
        self.sock = sock

    def connect(self) -> None:  # the socket is given; never dial again
        if self.sock is None:
            raise OSError("connection closed")


def _connect(addresses: list[IpAddress], port: int, deadline: float, host: str) -> socket.socket:
    errors = []
    for ip in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            return socket.create_connection((str(ip), port), timeout=left)
        except OSError as exc:
            errors.append(f"{ip}: {exc!r}")
    raise _unreachable(host, f"connecting: {'; '.join(errors) or 'deadline'}")


def _lookup(host: str, port: int, deadline: float) -> list[IpAddress]:
    """The platform's proxy's addresses (not subject to the policy: the platform named it)."""
    future = _RESOLVER.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=max(deadline - time.monotonic(), 0.001))
    except (OSError, FutureTimeout, UnicodeError) as exc:
        raise _unreachable(host, f"resolving the proxy: {exc!r}") from None
    return list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos))


def _tunnel(sock: socket.socket, host: str, port: int) -> None:
    """``CONNECT host:port`` through the proxy ``sock`` is connected to."""
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data or len(head) > 65536:
            raise OSError("the proxy closed the tunnel")
        head += data
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise OSError(f"the proxy refused the tunnel: {status[1:2]}")


@contextmanager
def _watchdog(sock: socket.socket, deadline: float, fired: list[bool]) -> Iterator[None]:
    """Shut ``sock`` down at ``deadline``: a peer that drips a byte at a time cannot stretch a
    request past it (a socket timeout is per read and restarts with every byte)."""

    def expire() -> None:
        fired.append(True)
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(deadline - time.monotonic(), 0.0), expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def request(
    method: str,
    url: str,
    *,
    policy: EgressPolicy,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    max_bytes: int = 0,
    sink: Callable[[bytes], None] | None = None,
) -> HttpAnswer:
    """One HTTP(S) request under ``policy``: no redirect followed, one total deadline.

    The body (up to ``max_bytes``; more is an :class:`EgressError` ``TooLarge``) goes to
    ``sink`` as it arrives. A status other than 2xx is returned, its body unread: the caller
    decides what it means, and nothing an unowned target sent is read back.
    """
    deadline = time.monotonic() + timeout_s
    parts = split_url(url)
    host, port, target = parts.host, parts.port, parts.target
    proxy = proxy_for(url)
    if proxy is None:
        sock = _connect(policy.resolve(host, port, deadline), port, deadline, host)
    else:
        policy.check_unresolved(host)
        sock = _connect(_lookup(proxy[0], proxy[1], deadline), proxy[1], deadline, host)
    fired: list[bool] = []
    try:
        with _watchdog(sock, deadline, fired):
            if proxy is not None and parts.scheme == "http":
                conn: http.client.HTTPConnection = _Pinned(host, port, sock)
                target = url.split("#", 1)[0]  # absolute form, to the proxy
            else:
                if proxy is not None:
                    _tunnel(sock, host, port)
                if parts.scheme == "https":
                    sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
                conn = _Pinned(host, port, sock)
            conn.request(method, target, headers=dict(headers or {}))
            resp = conn.getresponse()
            answer = HttpAnswer(resp.status, {k.lower(): v for k, v in resp.getheaders()})
            if 200 <= resp.status < 300 and method != "HEAD" and sink is not None:
                _stream(resp, sink, max_bytes, host)
            if fired:  # a body read until the close ends early, not in error: not whole
                raise OSError("deadline")
            return answer
    except EgressError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if fired:
            raise _unreachable(host, f"no whole answer within {timeout_s:.0f} s") from None
        raise _unreachable(host, f"{type(exc).__name__}: {exc}") from None
    finally:
        sock.close()


def _stream(
    resp: http.client.HTTPResponse, sink: Callable[[bytes], None], max_bytes: int, host: str
) -> None:
    total = 0
    while chunk := resp.read(CHUNK):
        total += len(chunk)
        if max_bytes and total > max_bytes:
            raise EgressError("TooLarge", f"{host}: the object is larger than {max_bytes} bytes")
        sink(chunk)
