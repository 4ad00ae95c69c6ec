"""Fetch a model file from object storage: verified, bounded, and never left half-written.

The object-store protocols are obstore's (the Rust ``object_store`` crate that Apache Arrow and
DataFusion read S3 and GCS through; one self-contained wheel, so no botocore, whose
``python-dateutil<3`` pin cannot live beside ``kubernetes==37``). Plain ``http(s)://`` URLs go
through :func:`packrat.runtime.egress.request` instead: obstore's HTTP client follows redirects
and resolves names itself, and a URL is exactly what a model author chooses. This module maps a
credentials directory (a mounted Secret) to the store's options, streams the object into a
temporary file next to the destination while hashing and counting it, checks the digest when
one is given, and renames the file into place only then. ``pvc://`` models are mounted, not
fetched: only their digest is verified (:func:`verify`).

Every request obeys :class:`FetchLimits`: the operator's egress policy (no internal address
unless allowed, the storage-host allow-list), one total deadline, a byte cap, no redirects
(http), credentials only for the host they belong to (``AUTHORIZATION`` only to the Secret's
``AUTHORIZATION_HOST``; S3 keys only to the Secret's own endpoint). Without keys, s3 and gs use
the provider's credential chain where the platform gave the pod an identity
(:data:`CLOUD_IDENTITIES`).

Every failure is a :class:`FetchError` with a short ``reason`` (``NotFound``, ``AccessDenied``,
``DigestMismatch``, ``VersionChanged``, ``Unreachable``, ``Redirected``, ``TooLarge``,
``HostNotAllowed``, ``BadUri``, ``MissingLibrary``) that the operator copies into the
PackratModel's condition; its text never carries what a store or an unowned server sent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrat.runtime.egress import (
    UNREACHABLE,
    EgressError,
    EgressPolicy,
    check_endpoint,
    host_matches,
    request,
    split_url,
)

__all__ = [
    "CLOUD_IDENTITIES",
    "FETCH_SCHEMES",
    "FetchError",
    "FetchLimits",
    "FetchResult",
    "fetch",
    "object_version",
    "read_credentials",
    "storage_options",
    "verify",
]

logger = logging.getLogger(__name__)

FETCH_SCHEMES = ("s3", "gs", "http", "https")
CHUNK_BYTES = 8 * 1024 * 1024
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# keys of a credentials Secret (one file per key when mounted), per scheme
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_REGION": "region",
}
GCS_KEY = "service-account.json"
HTTP_KEY = "AUTHORIZATION"
# the host (host or host:port, or .domain for its subdomains) AUTHORIZATION may be sent to:
# the Secret's owner names it, so a model author who can reference the Secret but not read it
# cannot have its value sent to a host of their choosing
HTTP_HOST_KEY = "AUTHORIZATION_HOST"
MAX_CREDENTIAL_BYTES = 64 * 1024
MAX_CA_BYTES = 1024 * 1024
DEFAULT_MAX_BYTES = 4 * 1024**3
# How the provider's credential chain is used when a Secret has no keys (s3, gs):
# - auto: when the environment names an identity (IRSA's web identity token, EKS Pod Identity
#   or ECS container credentials, GOOGLE_APPLICATION_CREDENTIALS); otherwise anonymous;
# - metadata: also the instance metadata services (EC2 IMDS, GCE/GKE Workload Identity);
# - none: anonymous requests unless the Secret has keys.
CLOUD_IDENTITIES = ("auto", "metadata", "none")
_AWS_IDENTITY_ENV = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
)
_GCS_IDENTITY_ENV = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
)


class FetchError(Exception):
    """The model could not be fetched or verified; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class FetchLimits:
    """What one fetch (or version check) for a model author may do: where it may go
    (:class:`~packrat.runtime.egress.EgressPolicy`), how long it may take in total, how many
    bytes it may bring, and whether the cloud's credential chain stands in for missing keys."""

    policy: EgressPolicy = field(default_factory=EgressPolicy)
    timeout_s: float = 1800.0
    max_bytes: int = DEFAULT_MAX_BYTES
    identity: str = "auto"

    def __post_init__(self) -> None:
        if self.identity not in CLOUD_IDENTITIES:
            raise ValueError(f"cloud identity must be one of {', '.join(CLOUD_IDENTITIES)}")
        if not (self.timeout_s > 0 and self.max_bytes > 0):
            raise ValueError("timeout_s and max_bytes must be > 0")


HEAD_LIMITS = FetchLimits(timeout_s=20.0)  # the operator's check must not hold a pass for long


@dataclass(frozen=True)
class FetchResult:
    path: Path
    sha256: str  # "sha256:<hex>"
    version: str  # the store's version of the object (ETag, generation, ...), "" if none
    size: int


def scheme_of(uri: str) -> str:
    match = re.match(r"^([a-z][a-z0-9+.-]*)://", uri)
    if match is None:
        raise FetchError("BadUri", f"{uri!r} has no scheme (s3://, gs://, https://)")
    return match.group(1)


def read_credentials(directory: Path | None) -> dict[str, str]:
    """The Secret mounted at ``directory`` as {key: value} (files; hidden entries skipped)."""
    if directory is None:
        return {}
    out: dict[str, str] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise FetchError("AccessDenied", f"credentials directory {directory}: {exc}") from None
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue  # the kubelet's ..data symlink farm
        data = entry.read_bytes()[:MAX_CREDENTIAL_BYTES]
        out[entry.name] = data.decode("utf-8", errors="replace").strip()
    return out


def uses_identity(scheme: str, identity: str, env: Mapping[str, str]) -> bool:
    """Whether a keyless ``scheme`` request goes through the provider's credential chain."""
    if identity == "none":
        return False
    if identity == "metadata":
        return True
    names = _AWS_IDENTITY_ENV if scheme == "s3" else _GCS_IDENTITY_ENV
    return any(env.get(name) for name in names)


def storage_options(
    uri: str,
    credentials: Mapping[str, str],
    *,
    identity: str = "auto",
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """obstore ``from_url`` keyword arguments for an s3:// or gs:// ``uri`` (pure but for
    ``env``, the process environment by default: where the platform puts a pod's identity).

    Keys in the Secret sign the requests. Without them the provider's credential chain does
    (:data:`CLOUD_IDENTITIES`), reading the environment (IRSA's ``AWS_ROLE_ARN`` and
    ``AWS_WEB_IDENTITY_TOKEN_FILE``, EKS Pod Identity's ``AWS_CONTAINER_CREDENTIALS_FULL_URI``,
    ``AWS_REGION``) or the metadata service; with no identity the requests go unsigned (a
    public bucket). The region is the Secret's, else the environment's: never forced.
    ``AWS_CA_BUNDLE`` in the environment adds the platform's CA (a store or an STS behind a
    private CA), as the AWS SDKs do.
    Retries are bounded in number and in total time: one call takes at most ``timeout_s``.
    """
    scheme = scheme_of(uri)
    if scheme not in ("s3", "gs"):
        raise FetchError("BadUri", f"{uri!r}: scheme {scheme}:// is not an object store")
    env = os.environ if env is None else env
    attempt = max(timeout_s / 2 - 0.5, 0.5)  # two attempts and a backoff fit in timeout_s
    client: dict[str, Any] = {
        "connect_timeout": f"{min(attempt, 10.0):.3f}s",
        "timeout": f"{attempt:.3f}s",
    }
    # a retry starts only within this window: after a first attempt that used all its time
    window = max(timeout_s - attempt - 0.5, 0.1)
    retry = {"max_retries": 1, "retry_timeout": _delta(window)}
    bundle = env.get("AWS_CA_BUNDLE")  # the platform's private CA (a store's, or its STS's)
    if bundle:
        try:
            client["root_certificate"] = Path(bundle).read_text(encoding="ascii")[:MAX_CA_BYTES]
        except (OSError, UnicodeDecodeError) as exc:
            raise FetchError("BadUri", f"AWS_CA_BUNDLE {bundle}: cannot read: {exc}") from None
    config: dict[str, Any] = {}
    if scheme == "s3":
        config = {S3_KEYS[k]: v for k, v in credentials.items() if k in S3_KEYS and v}
        keyed = "access_key_id" in config
        if not keyed and not uses_identity("s3", identity, env):
            config["skip_signature"] = True  # a public bucket
        if endpoint_of(uri, credentials, env=env).startswith("http://"):
            client["allow_http"] = True  # an S3-compatible store inside the cluster
    elif GCS_KEY in credentials:
        config["service_account_key"] = credentials[GCS_KEY]
    elif not uses_identity("gs", identity, env):
        config["skip_signature"] = True
    return {"config": config, "client_options": client, "retry_config": retry}


def _delta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def endpoint_of(
    uri: str, credentials: Mapping[str, str], *, env: Mapping[str, str] | None = None
) -> str:
    """The URL obstore will connect to for an s3:// or gs:// ``uri``: the Secret's endpoint,
    else the environment's (obstore reads it too), else the provider's."""
    env = os.environ if env is None else env
    if scheme_of(uri) == "s3":
        return (
            credentials.get("AWS_ENDPOINT_URL")
            or env.get("AWS_ENDPOINT_URL")
            or env.get("AWS_ENDPOINT")
            or "https://s3.amazonaws.com"
        )
    return "https://storage.googleapis.com"


def _classify(uri: str, exc: BaseException) -> FetchError:
    """A store's failure as a reason and a fixed text: nothing the store sent is copied
    (the detail goes to the log)."""
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, EgressError):
        return FetchError(exc.reason, f"{uri}: {exc.message}")
    from obstore import exceptions as oe

    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    logger.debug("store request for %s failed: %s", uri, text)
    lowered = text.lower()
    # status codes as whole words: the text holds the store's URL, whose port may be 40412
    if isinstance(exc, oe.NotFoundError | FileNotFoundError) or _says(
        lowered, r"\b404\b|nosuchkey|nosuchbucket"
    ):
        return FetchError("NotFound", f"{uri}: no such object")
    if isinstance(
        exc, oe.PermissionDeniedError | oe.UnauthenticatedError | PermissionError
    ) or _says(lowered, r"\b403\b|forbidden|accessdenied|invalidaccesskeyid"):
        return FetchError("AccessDenied", f"{uri}: credentials not accepted")
    if isinstance(exc, oe.PreconditionError):
        return FetchError("VersionChanged", f"{uri} changed since the operator checked it")
    return FetchError("Unreachable", f"{uri}: the store {UNREACHABLE}")


def _says(text: str, pattern: str) -> bool:
    return re.search(pattern, text) is not None


def _open(uri: str, credentials: Mapping[str, str], limits: FetchLimits) -> tuple[Any, str]:
    """(store, path in it) for an s3:// or gs:// ``uri``, its endpoint checked by the policy."""
    options = storage_options(
        uri, credentials, identity=limits.identity, timeout_s=limits.timeout_s
    )
    try:
        split_url(uri, schemes=("s3", "gs"))  # a plain bucket name, as for http(s) hosts
    except EgressError as exc:
        raise FetchError(exc.reason, exc.message) from None
    match = re.fullmatch(r"([a-z0-9]+)://([^/]+)/(.+)", uri)
    if match is None or match.group(3).endswith("/"):
        raise FetchError("BadUri", f"{uri!r} does not name one object")
    try:
        from obstore.store import from_url
    except ImportError:  # pragma: no cover - the images install the storage extra
        raise FetchError(
            "MissingLibrary", "obstore is not installed (pip install '.[storage]')"
        ) from None
    try:
        check_endpoint(endpoint_of(uri, credentials), limits.policy, timeout_s=limits.timeout_s)
        store = from_url(f"{match.group(1)}://{match.group(2)}", **options)
    except EgressError as exc:
        raise _classify(uri, exc) from None
    except Exception as exc:
        raise FetchError("BadUri", f"{uri}: {exc}"[:500]) from None
    return store, match.group(3)


def _http_headers(uri: str, credentials: Mapping[str, str]) -> dict[str, str]:
    """The Authorization header for ``uri``, only where the Secret allows its host. The host
    is read by :func:`~packrat.runtime.egress.split_url`, the parser the request itself uses:
    the host checked here is the host the header is sent to."""
    try:
        parts = split_url(uri)
    except EgressError as exc:
        raise FetchError(exc.reason, exc.message) from None
    token = credentials.get(HTTP_KEY)
    if not token:
        return {}
    allowed = [h for h in re.split(r"[\s,]+", credentials.get(HTTP_HOST_KEY, "")) if h]
    if not allowed or not (
        host_matches(parts.host, allowed) or host_matches(f"{parts.host}:{parts.port}", allowed)
    ):
        raise FetchError(
            "AccessDenied",
            f"{uri}: the credentials Secret's {HTTP_KEY} is sent only to the host(s) named by "
            f"its {HTTP_HOST_KEY} key, and {parts.host} is not one of them",
        )
    return {"Authorization": token}


def _http_failure(uri: str, status: int) -> FetchError:
    if status in (404, 410):
        return FetchError("NotFound", f"{uri}: no such object (HTTP {status})")
    if status in (401, 403):
        return FetchError("AccessDenied", f"{uri}: credentials not accepted (HTTP {status})")
    if status == 412:
        return FetchError("VersionChanged", f"{uri} changed since the operator checked it")
    if 300 <= status < 400:
        return FetchError(
            "Redirected",
            f"{uri}: the server answered a redirect (HTTP {status}); redirects are not "
            "followed: give the final URL",
        )
    return FetchError("Unreachable", f"{uri}: the server answered HTTP {status}")


def _http(
    method: str,
    uri: str,
    credentials: Mapping[str, str],
    limits: FetchLimits,
    *,
    extra: Mapping[str, str] | None = None,
    sink: Callable[[bytes], None] | None = None,
) -> Mapping[str, str]:
    headers = {**_http_headers(uri, credentials), **(extra or {})}
    try:
        answer = request(
            method,
            uri,
            policy=limits.policy,
            timeout_s=limits.timeout_s,
            headers=headers,
            max_bytes=limits.max_bytes,
            sink=sink,
        )
    except EgressError as exc:
        raise _classify(uri, exc) from None
    if not 200 <= answer.status < 300:
        raise _http_failure(uri, answer.status)
    return answer.headers


def object_version(
    uri: str, credentials: Mapping[str, str], *, limits: FetchLimits = HEAD_LIMITS
) -> str:
    """The store's current version of the object (its ETag), without reading it."""
    if scheme_of(uri) in ("http", "https"):
        headers = _http("HEAD", uri, credentials, limits)
        return headers.get("etag") or f"size:{headers.get('content-length')}"
    if scheme_of(uri) not in FETCH_SCHEMES:
        raise FetchError("BadUri", f"{uri!r}: scheme {scheme_of(uri)}:// is not fetched")
    import obstore

    store, path = _open(uri, credentials, limits)
    try:
        meta = obstore.head(store, path)
    except Exception as exc:
        raise _classify(uri, exc) from None
    return str(meta.get("e_tag") or meta.get("version") or f"size:{meta.get('size')}")


def _check_digest(digest: str | None, actual: str, *, what: str) -> None:
    if digest is None:
        return
    if not DIGEST_RE.fullmatch(digest):
        raise FetchError("BadUri", f"digest must be sha256:<64 hex digits>, got {digest!r}")
    if actual != digest:
        raise FetchError("DigestMismatch", f"{what}: sha256 is {actual}, expected {digest}")


class _Sink:
    """Writes the body to the temporary file while hashing and counting it (capped)."""

    def __init__(self, out: Any, uri: str, max_bytes: int, deadline: float) -> None:
        self.out, self.uri, self.max_bytes, self.deadline = out, uri, max_bytes, deadline
        self.hasher = hashlib.sha256()
        self.size = 0

    def __call__(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        self.size += len(view)
        if self.size > self.max_bytes:
            raise FetchError(
                "TooLarge", f"{self.uri}: the object is larger than {self.max_bytes} bytes"
            )
        if time.monotonic() > self.deadline:
            raise FetchError("Unreachable", f"{self.uri}: the store {UNREACHABLE}")
        self.hasher.update(view)
        self.out.write(view)


def _download(
    uri: str,
    credentials: Mapping[str, str],
    limits: FetchLimits,
    sink: _Sink,
    expect_version: str | None,
) -> str:
    """Stream ``uri`` into ``sink``; returns the store's version of what was read."""
    if scheme_of(uri) in ("http", "https"):
        extra = {"If-Match": expect_version} if expect_version else None
        headers = _http("GET", uri, credentials, limits, extra=extra, sink=sink)
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) != sink.size:
            raise FetchError("Unreachable", f"{uri}: got {sink.size} of {declared} bytes")
        return headers.get("etag") or ""
    import obstore

    store, path = _open(uri, credentials, limits)
    try:
        options: dict[str, Any] = {"if_match": expect_version} if expect_version else {}
        result = obstore.get(store, path, options=options or None)  # type: ignore[arg-type]
        meta = result.meta
        declared_size = meta.get("size")
        if isinstance(declared_size, int) and declared_size > limits.max_bytes:
            raise FetchError(
                "TooLarge", f"{uri}: the object is larger than {limits.max_bytes} bytes"
            )
        for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
            sink(chunk)
    except Exception as exc:
        raise _classify(uri, exc) from None
    if isinstance(declared_size, int) and declared_size != sink.size:
        raise FetchError("Unreachable", f"{uri}: got {sink.size} of {declared_size} bytes")
    return str(meta.get("e_tag") or meta.get("version") or "")


def fetch(
    uri: str,
    dest: Path,
    *,
    credentials: Mapping[str, str],
    digest: str | None = None,
    expect_version: str | None = None,
    limits: FetchLimits | None = None,
) -> FetchResult:
    """Download ``uri`` to ``dest``: to a temporary file first, renamed only once verified.

    ``expect_version`` is sent as ``If-Match``: the store refuses the download when the object
    is no longer that version (``VersionChanged``). ``limits`` bound where it goes, how long it
    takes and how many bytes it brings (``TooLarge``).
    """
    limits = limits or FetchLimits()
    if digest is not None and not DIGEST_RE.fullmatch(digest):
        raise FetchError("BadUri", f"digest must be sha256:<64 hex digits>, got {digest!r}")
    if scheme_of(uri) not in FETCH_SCHEMES:
        raise FetchError("BadUri", f"{uri!r}: scheme {scheme_of(uri)}:// is not fetched")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        with part.open("wb") as out:
            sink = _Sink(out, uri, limits.max_bytes, time.monotonic() + limits.timeout_s)
            version = _download(uri, credentials, limits, sink, expect_version)
            out.flush()
            os.fsync(out.fileno())
        actual = "sha256:" + sink.hasher.hexdigest()
        _check_digest(digest, actual, what=uri)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return FetchResult(path=dest, sha256=actual, version=version, size=sink.size)


def verify(path: Path, digest: str) -> FetchResult:
    """Check a mounted model file (``pvc://``) against ``digest``."""
    hasher = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as src:
            while chunk := src.read(CHUNK_BYTES):
                hasher.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        raise FetchError("NotFound", f"{path}: no such file on the volume") from None
    except OSError as exc:
        raise FetchError("Unreachable", f"{path}: {exc}") from None
    actual = "sha256:" + hasher.hexdigest()
    _check_digest(digest, actual, what=str(path))
    return FetchResult(path=path, sha256=actual, version="", size=size)
