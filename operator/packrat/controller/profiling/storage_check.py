"""Ask the store for a storageUri model's current version (ETag) before profiling.

Runs once per ``Config.storage_check_seconds`` per model (and at once when the URI or the
Secret changes) for a model without a pinned ``digest``; with a digest the model's identity
is the digest and the store is never asked by the operator. The version goes into the
defaulted spec (``model.observedVersion``), so the profile key and the serving hash change
when the object is replaced under the same URI: the model is re-profiled and the new plan
rolled out through a slot switch.

A missing object, rejected credentials, a missing Secret or an unreachable store set
``ModelAvailable=False`` with the reason and a Warning event. Before any version is known
the model is ``Failed`` and nothing is created; once one is, the model keeps that version
(its profile and its serving slot) until the store answers again.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from packrat.controller.api.backoff import backoff
from packrat.controller.api.frozen import thaw
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.status import now_iso
from packrat.controller.core.storage import VERSION_KEY, needs_version_check
from packrat.runtime.fetch import HEAD_LIMITS, FetchError, FetchLimits, object_version

CONDITION = "ModelAvailable"
VersionOf = Callable[[str, Mapping[str, str]], str]


def head_limits(p: Pass) -> FetchLimits:
    """The operator's storage limits for one version check (its short deadline)."""
    storage = p.config.storage
    return FetchLimits(
        policy=storage.policy,
        timeout_s=HEAD_LIMITS.timeout_s,
        max_bytes=storage.max_model_bytes,
        identity=storage.cloud_identity,
    )


def _secret_data(p: Pass, name: str) -> dict[str, str]:
    secret = p.kube.get("secrets", p.namespace, name)
    if secret is None:
        raise FetchError("SecretNotFound", f"credentials secret {p.namespace}/{name} not found")
    out: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise FetchError("AccessDenied", f"secret {name}: key {key} is not base64") from None
    for key, value in (secret.get("stringData") or {}).items():
        out.setdefault(str(key), str(value).strip())
    return out


def _fingerprint(uri: str, credentials: Mapping[str, str]) -> str:
    text = json.dumps([uri, sorted(credentials.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_version(
    p: Pass, model: ModelSpec, *, version_of: VersionOf | None = None
) -> ModelSpec | None:
    """``model`` with the store's version filled in; None (condition and event set) on failure."""
    spec_model = thaw(model.source.doc)
    if not needs_version_check(spec_model):
        return model
    uri = str(model.source.storage_uri)
    seen = dict(p.status.get("storage") or {})
    tried: str | None = None
    try:
        secret = model.source.credentials_secret
        credentials = _secret_data(p, secret) if secret else {}
        fingerprint = tried = _fingerprint(uri, credentials)
        fresh = (
            seen.get("fingerprint") == fingerprint
            and seen.get("version")
            and not seen.get("error")  # after a failure, ask again once its backoff is over
            and p.seconds_since(seen.get("checkedAt")) < p.config.storage_check_seconds
        )
        _backing_off(p, seen, uri=uri, tried=tried)
        ask = version_of or _store_version(p)
        version = str(seen["version"]) if fresh else ask(uri, credentials)
    except FetchError as exc:
        return _failed_check(p, model, exc, seen=seen, uri=uri, tried=tried)
    if not fresh:
        _record_version(p, seen, uri=uri, version=version, fingerprint=fingerprint)
    p.cond(CONDITION, True, "Found", f"{uri} version {version}")
    return _with_version(model, version)


def _failed_check(
    p: Pass,
    model: ModelSpec,
    exc: FetchError,
    *,
    seen: Mapping[str, Any],
    uri: str,
    tried: str | None,
) -> ModelSpec | None:
    """A failed version check: status, condition and event (once per message), a retry at
    the backoff's end; the model on the version last found, else None (the model fails)."""
    held = isinstance(exc, _HeldError)
    message = exc.message if held else f"model {uri}: {exc.message}"[:1000]
    if seen.get("error") != message:
        p.emit("Warning", exc.reason, message)
    known = seen.get("version") if seen.get("uri") == uri else None
    failures = int(seen.get("failures") or 0) + (0 if held else 1)
    storage = {
        "uri": uri,
        **({"version": known, "fingerprint": seen.get("fingerprint")} if known else {}),
        "error": message,
        "reason": exc.reason,
        "failures": failures,
        **({"tried": tried} if tried else {}),
        "checkedAt": seen["checkedAt"] if held else now_iso(p.now),
    }
    p.status.set_storage(storage)
    p.cond(CONDITION, False, exc.reason, message)
    # look again when the backoff ends (the object or the Secret may appear meanwhile)
    p.result.again_within(_retry_left(p, storage))
    if known:  # the version profiled and served stays in use; nothing is re-profiled
        return _with_version(model, str(known))
    p.status.set_message(message)
    p.cond("Ready", False, exc.reason, message)
    p.status.failed()
    p.result.result = "storage_error"
    return None


def _record_version(
    p: Pass, seen: Mapping[str, Any], *, uri: str, version: str, fingerprint: str
) -> None:
    """The version just read, in status; a new version of the same URI is re-profiled."""
    previous = seen.get("version")
    if previous and previous != version and seen.get("uri") == uri:
        p.emit(
            "Normal",
            "ModelChanged",
            f"{uri} changed (version {previous} -> {version}): re-profiling",
        )
    p.status.set_storage(
        {
            "uri": uri,
            "version": version,
            "fingerprint": fingerprint,
            "checkedAt": now_iso(p.now),
        }
    )


def _store_version(p: Pass) -> VersionOf:
    """The store's version of an object, asked under the operator's egress policy."""
    return functools.partial(object_version, limits=head_limits(p))


class _HeldError(FetchError):
    """The last failure, repeated without asking the store: its backoff is not over."""


def retry_delay(failures: int, cap: float, *, seed: str = "") -> float:
    """Seconds before the store is asked again after ``failures`` failures in a row:
    2, 4, 8, ... up to ``cap`` (the storage check interval), with the jitter of ``seed`` (the
    model), so an outage of the store or a missing Secret costs each model a handful of
    requests, not one every poll, and the models' retries spread apart. Whole seconds: the
    time of the last check is kept to the second (``checkedAt``)."""
    return float(max(1, round(backoff(max(failures, 1), base=2.0, cap=max(cap, 1.0), seed=seed))))


def _seed(p: Pass) -> str:
    return f"{p.namespace}/{p.name}/storage"


def _retry_left(p: Pass, storage: Mapping[str, Any]) -> float:
    delay = retry_delay(
        int(storage.get("failures") or 1), p.config.storage_check_seconds, seed=_seed(p)
    )
    return max(delay - p.seconds_since(storage.get("checkedAt")), 0.5)


def _backing_off(p: Pass, seen: Mapping[str, Any], *, uri: str, tried: str | None) -> None:
    """Raise the last failure again while its backoff runs, unless the URI or the Secret's
    contents changed since (then the store is asked at once: the user may have fixed it)."""
    if not seen.get("error") or seen.get("uri") != uri or seen.get("tried") != tried:
        return
    delay = retry_delay(
        int(seen.get("failures") or 1), p.config.storage_check_seconds, seed=_seed(p)
    )
    if p.seconds_since(seen.get("checkedAt")) < delay:
        raise _HeldError(str(seen.get("reason") or "Unavailable"), str(seen["error"]))


def _with_version(model: ModelSpec, version: str) -> ModelSpec:
    return model.with_spec(model={**thaw(model.source.doc), VERSION_KEY: version})
