"""Fetch a model file from object storage: verified, and never left half-written under its name.

The protocol code is obstore's (the Rust ``object_store`` crate that Apache Arrow and
DataFusion read S3, GCS, Azure and HTTP through; one self-contained wheel, so no botocore,
whose ``python-dateutil<3`` pin cannot live beside ``kubernetes==37``). This module only maps a
credentials directory (a mounted Secret) to the store's options, streams the object into a
temporary file next to the destination while hashing it, checks the digest when one is given,
and renames the file into place only then. ``pvc://`` models are mounted, not fetched: only
their digest is verified (:func:`verify`).

Every failure is a :class:`FetchError` with a short ``reason`` (``NotFound``, ``AccessDenied``,
``DigestMismatch``, ``VersionChanged``, ``Unreachable``, ``BadUri``, ``MissingLibrary``) that the
operator copies into the PackratModel's condition.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "FETCH_SCHEMES",
    "FetchError",
    "FetchResult",
    "fetch",
    "object_version",
    "read_credentials",
    "storage_options",
    "verify",
]

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
MAX_CREDENTIAL_BYTES = 64 * 1024
TIMEOUT = "60s"  # connect timeout; a stalled transfer is retried by the store's own policy
HEAD_TIMEOUT = "20s"  # the operator's ETag check must not hold a reconcile pass for long


class FetchError(Exception):
    """The model could not be fetched or verified; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


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


def storage_options(uri: str, credentials: Mapping[str, str]) -> dict[str, Any]:
    """obstore ``from_url`` keyword arguments for ``uri`` from a Secret's keys (pure)."""
    scheme = scheme_of(uri)
    if scheme not in FETCH_SCHEMES:
        raise FetchError("BadUri", f"{uri!r}: scheme {scheme}:// is not fetched")
    client: dict[str, Any] = {"connect_timeout": TIMEOUT}
    config: dict[str, Any] = {}
    if scheme == "s3":
        config = {S3_KEYS[k]: v for k, v in credentials.items() if k in S3_KEYS and v}
        if "access_key_id" not in config:
            config["skip_signature"] = True  # a public bucket
        config.setdefault("region", "us-east-1")
        if str(config.get("endpoint", "")).startswith("http://"):
            client["allow_http"] = True  # an S3-compatible store inside the cluster
    elif scheme == "gs":
        if GCS_KEY in credentials:
            config["service_account_key"] = credentials[GCS_KEY]
        else:
            config["skip_signature"] = True
    else:
        if credentials.get(HTTP_KEY):
            client["default_headers"] = {"Authorization": credentials[HTTP_KEY]}
        client["allow_http"] = scheme == "http"
    return {"config": config, "client_options": client}


def _classify(uri: str, exc: BaseException) -> FetchError:
    if isinstance(exc, FetchError):
        return exc
    from obstore import exceptions as oe

    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if isinstance(exc, oe.NotFoundError | FileNotFoundError):
        return FetchError("NotFound", f"{uri}: no such object ({text})")
    if isinstance(exc, oe.PermissionDeniedError | oe.UnauthenticatedError | PermissionError):
        return FetchError("AccessDenied", f"{uri}: credentials not accepted ({text})")
    if isinstance(exc, oe.PreconditionError):
        return FetchError("VersionChanged", f"{uri} changed since the operator checked it")
    lowered = text.lower()
    if any(w in lowered for w in ("403", "forbidden", "accessdenied", "invalidaccesskeyid")):
        return FetchError("AccessDenied", f"{uri}: credentials not accepted ({text})")
    if any(w in lowered for w in ("404", "nosuchkey", "nosuchbucket")):
        return FetchError("NotFound", f"{uri}: no such object ({text})")
    return FetchError("Unreachable", f"{uri}: {text}")


def _open(
    uri: str, credentials: Mapping[str, str], *, request_timeout: str | None = None
) -> tuple[Any, str]:
    """(store, path in it) for ``uri``; ``request_timeout`` bounds each whole request."""
    options = storage_options(uri, credentials)
    if request_timeout is not None:
        options["client_options"]["timeout"] = request_timeout
    match = re.match(r"^([a-z0-9]+)://([^/]+)/(.+)$", uri)
    if match is None or match.group(3).endswith("/"):
        raise FetchError("BadUri", f"{uri!r} does not name one object")
    try:
        from obstore.store import from_url
    except ImportError:  # pragma: no cover - the images install the storage extra
        raise FetchError(
            "MissingLibrary", "obstore is not installed (pip install '.[storage]')"
        ) from None
    try:
        store = from_url(f"{match.group(1)}://{match.group(2)}", **options)
    except Exception as exc:
        raise FetchError("BadUri", f"{uri}: {exc}"[:500]) from None
    return store, match.group(3)


def object_version(uri: str, credentials: Mapping[str, str]) -> str:
    """The store's current version of the object (its ETag), without reading it."""
    import obstore

    store, path = _open(uri, credentials, request_timeout=HEAD_TIMEOUT)
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


def fetch(
    uri: str,
    dest: Path,
    *,
    credentials: Mapping[str, str],
    digest: str | None = None,
    expect_version: str | None = None,
) -> FetchResult:
    """Download ``uri`` to ``dest``: to a temporary file first, renamed only once verified.

    ``expect_version`` is sent as ``If-Match``: the store refuses the download when the object
    is no longer that version (``VersionChanged``).
    """
    import obstore

    if digest is not None and not DIGEST_RE.fullmatch(digest):
        raise FetchError("BadUri", f"digest must be sha256:<64 hex digits>, got {digest!r}")
    store, path = _open(uri, credentials)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    hasher = hashlib.sha256()
    size = 0
    try:
        try:
            options: dict[str, Any] = {"if_match": expect_version} if expect_version else {}
            result = obstore.get(store, path, options=options or None)  # type: ignore[arg-type]
            meta = result.meta
            with part.open("wb") as out:
                for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                    view = memoryview(chunk)
                    hasher.update(view)
                    out.write(view)
                    size += len(view)
                out.flush()
                os.fsync(out.fileno())
        except Exception as exc:
            raise _classify(uri, exc) from None
        expected_size = meta.get("size")
        if isinstance(expected_size, int) and expected_size != size:
            raise FetchError("Unreachable", f"{uri}: got {size} of {expected_size} bytes")
        actual = "sha256:" + hasher.hexdigest()
        _check_digest(digest, actual, what=uri)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    version = str(meta.get("e_tag") or meta.get("version") or "")
    return FetchResult(path=dest, sha256=actual, version=version, size=size)


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
