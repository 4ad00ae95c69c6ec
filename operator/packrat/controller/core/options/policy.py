"""The platform's allow-lists for what a model author may choose (issue 26, item 7).

A PackratModel's author picks the image its pods run, ``spec.pod.serviceAccountName``,
``priorityClassName``, environment variables read from Secrets, and the storage its model is
fetched from. The operator creates those pods with its own rights, so whoever may create
PackratModels in a namespace may run any image there as any service account, and read any
Secret of the namespace into a pod they control (see docs/security.md for the trust model).
A platform team that grants PackratModel creation more widely than pod creation narrows it
here: each list, when set (a chart value, a ``packrat operator`` flag), is what the operator
accepts; a spec outside it is refused with ``Ready=False`` (reason ``PolicyRefused``) and a
Warning event, nothing is created for it, and the last good configuration keeps serving.
Unset, a list does not restrict (the behaviour before it existed).

Patterns: an image entry ending in ``*`` is a prefix (``registry.example.com/packrat/*``),
any other entry is matched exactly (an image without its tag or digest also matches every tag
and digest of it). The operator's own default image is always allowed. Storage hosts are the
egress policy's (``--storage-host``, :mod:`packrat.runtime.egress`), enforced on every fetch
and checked here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.storage import split_uri
from packrat.runtime.egress import host_matches

Allowed = tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class ModelPolicy:
    """What model authors may choose; None: not restricted."""

    images: Allowed = None
    service_accounts: Allowed = None
    priority_classes: Allowed = None
    env_secrets: Allowed = None

    @classmethod
    def parse(cls, **lists: Sequence[str] | None) -> ModelPolicy:
        """From flag values (None: unset); ValueError naming a bad entry."""
        out: dict[str, Allowed] = {}
        for key, values in lists.items():
            if values is None:
                out[key] = None
                continue
            cleaned = tuple(v.strip() for v in values)
            for v in cleaned:
                if any(c.isspace() for c in v) or ("*" in v and not v.endswith("*")):
                    raise ValueError(f"{key.replace('_', ' ')}: not a name or prefix*: {v!r}")
            out[key] = cleaned
        return cls(**out)


def _image_allowed(image: str, patterns: Sequence[str]) -> bool:
    bare = image.split("@", 1)[0]
    if ":" in bare.rsplit("/", 1)[-1]:
        bare = bare.rsplit(":", 1)[0]
    return any(
        (p.endswith("*") and image.startswith(p[:-1])) or p in (image, bare) for p in patterns
    )


def refused_by_policy(
    spec: Mapping[str, Any],
    policy: ModelPolicy,
    *,
    default_image: str,
    storage_hosts: Sequence[str] = (),
) -> list[str]:
    """Why ``spec`` (a defaulted PackratModel spec) is outside ``policy``, one line each.
    ``storage_hosts``: the egress policy's allow-list (``--storage-host``), checked here for
    http(s) URLs too so that a model pinned by digest, which the operator never fetches, is
    refused before its pods are made rather than in its init container."""
    out: list[str] = []
    pod = spec.get("pod") or {}
    image = str(spec.get("image") or default_image)
    images = policy.images
    if images is not None and image != default_image and not _image_allowed(image, images):
        out.append(f"spec.image {image!r} is not among the images the operator allows")
    checks = (
        ("serviceAccountName", policy.service_accounts, "service accounts"),
        ("priorityClassName", policy.priority_classes, "priority classes"),
    )
    for key, allowed, what in checks:
        value = pod.get(key)
        if allowed is not None and value is not None and value not in allowed:
            out.append(f"spec.pod.{key} {value!r} is not among the {what} the operator allows")
    if policy.env_secrets is not None:
        for item in pod.get("env") or []:
            ref = ((item or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            name = ref.get("name")
            if name is not None and name not in policy.env_secrets:
                out.append(
                    f"spec.pod.env {item.get('name')!r} reads Secret {name!r}, which the "
                    "operator does not allow in model environments"
                )
    uri = (spec.get("model") or {}).get("storageUri")
    if storage_hosts and isinstance(uri, str) and uri.startswith(("http://", "https://")):
        host = split_uri(uri)[1].rsplit("@", 1)[-1].split(":")[0]
        if not host_matches(host, storage_hosts):
            out.append(f"spec.model.storageUri: {host} is not a storage host the operator allows")
    return out
