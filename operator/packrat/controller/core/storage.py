"""``spec.model.storageUri``: validation, identity, volumes and the fetch command (all pure).

A storage model is fetched by an init container running ``packrat fetch`` (obstore underneath)
into an emptyDir, or, for ``pvc://CLAIM/PATH``, mounted read-only from the claim (its digest,
when given, verified by ``packrat fetch --verify``). The credentials Secret is mounted into the
fetch container only, read-only; the serving and profiling containers never see it.

The object's identity in the profile key is its digest when the spec pins one, otherwise the
version (ETag) the operator last observed in the store (``observedVersion``, injected into the
defaulted spec by :mod:`packrat.controller.profiling.storage_check`); a model replaced under the
same URI
therefore changes the key and is re-profiled, and the serving hash changes with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packrat.runtime.egress import EgressError, EgressPolicy, split_url
from packrat.runtime.fetch import DEFAULT_MAX_BYTES

STORAGE_SCHEMES = ("s3", "gs", "http", "https", "pvc")
FETCHED_SCHEMES = ("s3", "gs", "http", "https")
CREDENTIALS_DIR = "/credentials"
CREDENTIALS_VOLUME = "model-credentials"
VERSION_KEY = "observedVersion"  # set by the operator, never by the user
SECRET_MODE = 0o440  # owner and the pod's fsGroup may read

# the authority is what the fetch's one parser accepts (packrat.runtime.egress.split_url: a
# plain host[:port], no user info, '?', '#' or '\\' that could hide a second host)
_URI_RE = re.compile(
    r"^(s3|gs|https?|pvc)://((?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?)(/\S*)?$"
)
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PVC_PATH_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")


@dataclass(frozen=True)
class StorageLimits:
    """The operator's limits on what it and its init containers fetch for model authors
    (the ``packrat fetch`` flags it shares with the operator)."""

    policy: EgressPolicy = field(default_factory=EgressPolicy)
    """Where a fetch may go: the internal ranges allowed (``--egress-allow``) and the
    storage-host allow-list (``--storage-host``)."""
    max_model_bytes: int = DEFAULT_MAX_BYTES
    """The largest model file, in bytes (``--max-model-bytes``); also the ``sizeLimit`` of the
    model's emptyDir."""
    cloud_identity: str = "auto"
    """Whether s3 and gs use the provider's credential chain when the Secret has no keys
    (``--cloud-identity``: auto, metadata or none, as :mod:`packrat.runtime.fetch` says)."""

    def fetch_flags(self) -> list[str]:
        """``packrat fetch`` arguments carrying these limits into the init container."""
        return [
            *self.policy.flags(),
            "--max-model-bytes",
            str(self.max_model_bytes),
            "--cloud-identity",
            self.cloud_identity,
        ]

    def tmp_volume(self) -> dict[str, Any]:
        """The pods' /tmp: the weight file, a .mar's extraction, the runtime's files (two
        copies of the largest model and 1 GiB beside), never the node's whole disk."""
        return {"name": "tmp", "emptyDir": {"sizeLimit": str(2 * self.max_model_bytes + 1024**3)}}

    def model_volume(self) -> dict[str, Any]:
        """The emptyDir a model file is fetched into: no bigger than the largest model."""
        return {"name": "model", "emptyDir": {"sizeLimit": str(self.max_model_bytes)}}


DEFAULT_LIMITS = StorageLimits()


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, authority, path without the leading slash); ValueError when malformed."""
    match = _URI_RE.fullmatch(uri)
    if match is None:
        raise ValueError(uri)
    return match.group(1), match.group(2), (match.group(3) or "/")[1:]


def validate_storage(errors: list[str], model: Mapping[str, Any]) -> None:
    """Append every problem with the storage fields of ``spec.model`` the CRD's schema and
    CEL rules cannot state (they check the fields' shapes and which go together): the
    fetch's own URL parser, a pvc path without '..', a Secret's DNS name."""
    uri = model.get("storageUri")
    secret = model.get("credentialsSecret")
    if not isinstance(uri, str):
        return
    try:
        scheme, _, path = split_uri(uri)
        if scheme != "pvc":
            split_url(uri, schemes=FETCHED_SCHEMES)  # the parser the fetch itself uses
    except (ValueError, EgressError):
        errors.append(
            "spec.model.storageUri must be s3://BUCKET/KEY, gs://BUCKET/OBJECT, "
            f"http(s)://HOST/PATH or pvc://CLAIM/PATH, got {uri!r}"
        )
        return
    if not path or path.endswith("/"):
        errors.append(f"spec.model.storageUri must name one file, got {uri!r}")
    if scheme == "pvc" and (not _PVC_PATH_RE.fullmatch(path) or ".." in path.split("/")):
        errors.append(f"spec.model.storageUri: pvc path must be relative without '..': {uri!r}")
    name = secret.get("name") if isinstance(secret, Mapping) else None
    if isinstance(name, str) and not _DNS_SUBDOMAIN_RE.fullmatch(name):
        errors.append(f"spec.model.credentialsSecret.name must be a DNS subdomain, got {name!r}")


def storage_identity(model: Mapping[str, Any]) -> str:
    """The model's part of the profile key: URI, format and digest or observed version."""
    pin = model.get("digest") or f"version:{model.get(VERSION_KEY, '')}"
    return f"storage:{model['storageUri']}:{model.get('format')}:{pin}"


def needs_version_check(model: Mapping[str, Any]) -> bool:
    """Whether the operator asks the store for the object's version (no digest, not a pvc)."""
    uri = model.get("storageUri")
    return isinstance(uri, str) and not model.get("digest") and not uri.startswith("pvc://")


def storage_source(
    model: Mapping[str, Any],
    *,
    model_dir: str,
    suffix: str,
    limits: StorageLimits = DEFAULT_LIMITS,
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(the model file's path in the pod, volumes, the model mount) for a storage model."""
    scheme, claim, path = split_uri(str(model["storageUri"]))
    mount = {"name": "model", "mountPath": model_dir, "readOnly": True}
    if scheme == "pvc":
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return f"{model_dir}/{path}", [volume], [mount]
    return f"{model_dir}/model{suffix}", [limits.model_volume()], [mount]


def fetch_command(
    model: Mapping[str, Any],
    *,
    target: str,
    expect_version: bool,
    limits: StorageLimits = DEFAULT_LIMITS,
) -> list[str] | None:
    """The init container's ``packrat fetch`` command; None when nothing needs to run."""
    uri = str(model["storageUri"])
    digest = model.get("digest")
    if uri.startswith("pvc://"):
        return ["packrat", "fetch", "--verify", target, "--digest", str(digest)] if digest else None
    cmd = ["packrat", "fetch", uri, "-o", target]
    if model.get("credentialsSecret"):
        cmd += ["--credentials-dir", CREDENTIALS_DIR]
    if digest:
        cmd += ["--digest", str(digest)]
    elif expect_version and model.get(VERSION_KEY):
        cmd += ["--expect-version", str(model[VERSION_KEY])]
    return [*cmd, *limits.fetch_flags()]


def credentials_volume(model: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """([the Secret volume] or [], the fetch container's mount of it or {})."""
    secret = model.get("credentialsSecret")
    if not secret:
        return [], {}
    volume = {
        "name": CREDENTIALS_VOLUME,
        "secret": {"secretName": str(secret["name"]), "defaultMode": SECRET_MODE},
    }
    mount = {"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_DIR, "readOnly": True}
    return [volume], mount


def fetch_container(
    model: Mapping[str, Any],
    *,
    target: str,
    model_mount: Mapping[str, Any],
    base: Mapping[str, Any],
    expect_version: bool,
    limits: StorageLimits = DEFAULT_LIMITS,
) -> dict[str, Any] | None:
    """The ``fetch-model`` init container (``base``: image, resources, security, env)."""
    command = fetch_command(model, target=target, expect_version=expect_version, limits=limits)
    if command is None:
        return None
    _, secret_mount = credentials_volume(model)
    downloads = not str(model["storageUri"]).startswith("pvc://")
    return {
        "name": "fetch-model",
        **base,
        "command": command,
        "volumeMounts": [
            {**model_mount, "readOnly": not downloads},
            {"name": "tmp", "mountPath": "/tmp"},
            *([secret_mount] if secret_mount else []),
        ],
    }
