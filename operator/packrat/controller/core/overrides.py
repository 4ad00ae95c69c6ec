"""``spec.pod``: the user's pod overrides, validated and applied to serving and profiling pods.

What may be set: pod annotations and labels (for example a service mesh's sidecar opt-out,
whose sidecar would otherwise take a share of the cores and break Guaranteed QoS),
imagePullSecrets, serviceAccountName, priorityClassName and extra environment variables for
every container. What may not: resources (every container keeps requests == limits with
integer CPUs, so the pod stays Guaranteed), the operator's own labels and annotations
(``packrat.dev/*``, ``app.kubernetes.io/*``: the Service and slot selectors use them), and
the environment variables the operator or the pinning sets (``PACKRAT_*``, thread counts,
``HOME``, ``TMPDIR``). The service account token stays unmounted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packrat.runtime.egress import EgressError, host_matches, split_url

# What the CRD's schema and CEL rules check (fields, types, lengths, the reserved prefixes
# packrat.dev/ and app.kubernetes.io/ and the operator's environment variables) is checked
# from the CRD (packrat.controller.api.schema); validate_pod checks what they cannot state.
RESERVED_LABELS = {"job-name", "controller-uid", "batch.kubernetes.io/job-name"}
VALUE_FROM = {"secretKeyRef", "configMapKeyRef", "fieldRef"}
_NOT_ALLOWED_HINT = " (resources stay requests == limits: set cpus and memory)"

_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _validate_map(errors: list[str], value: Any, *, what: str, labels: bool) -> None:
    if not isinstance(value, Mapping):
        return
    for key, item in value.items():
        if not (isinstance(key, str) and len(key) <= 316 and _QUALIFIED_NAME.fullmatch(key)):
            errors.append(f"spec.pod.{what}: {key!r} is not a valid key")
        elif key in RESERVED_LABELS:
            errors.append(f"spec.pod.{what}: {key!r} is reserved for the operator")
        if labels and isinstance(item, str) and not _LABEL_VALUE.fullmatch(item):
            errors.append(f"spec.pod.labels.{key}: {item!r} is not a valid label value")


def _validate_env(errors: list[str], env: Any) -> None:
    if not isinstance(env, list):
        return
    seen: set[str] = set()
    for i, item in enumerate(env):
        if not isinstance(item, Mapping):
            continue
        name = item.get("name")
        if isinstance(name, str) and name in seen:
            errors.append(f"spec.pod.env[{i}]: {name} repeats")
        seen.add(str(name))
        source = item.get("valueFrom")
        if isinstance(source, Mapping) and not set(source) <= VALUE_FROM:
            errors.append(
                f"spec.pod.env[{i}].valueFrom must be one of {', '.join(sorted(VALUE_FROM))}"
            )


def explain_not_allowed(message: str) -> str:
    """The schema's message for an unknown ``spec.pod`` field, with the reason where a user
    may well have tried it (resources)."""
    for key in ("resources", "containers"):
        if message == f"spec.pod.{key}: unknown field":
            return f"spec.pod.{key}: unknown or not allowed field{_NOT_ALLOWED_HINT}"
    return message


def validate_pod(errors: list[str], pod: Any) -> None:
    """Append every problem with ``spec.pod`` (None: nothing to check) the CRD cannot state:
    label and annotation keys, a label value's characters, object names, repeated variables."""
    if not isinstance(pod, Mapping):
        return
    if "annotations" in pod:
        _validate_map(errors, pod["annotations"], what="annotations", labels=False)
    if "labels" in pod:
        _validate_map(errors, pod["labels"], what="labels", labels=True)
    for key in ("serviceAccountName", "priorityClassName"):
        value = pod.get(key)
        if isinstance(value, str) and not _DNS_SUBDOMAIN.fullmatch(value):
            errors.append(f"spec.pod.{key} must be a DNS subdomain name, got {value!r}")
    secrets = pod.get("imagePullSecrets")
    for i, secret in enumerate(secrets if isinstance(secrets, list) else []):
        name = secret.get("name") if isinstance(secret, Mapping) else None
        if isinstance(name, str) and not _DNS_SUBDOMAIN.fullmatch(name):
            errors.append(f"spec.pod.imagePullSecrets[{i}].name must be a DNS subdomain name")
    if "env" in pod:
        _validate_env(errors, pod["env"])


def apply_pod(
    template_meta: dict[str, Any], pod_spec: dict[str, Any], pod: Mapping[str, Any] | None
) -> None:
    """Apply validated overrides in place to a pod template (its metadata and spec)."""
    if not pod:
        return
    if pod.get("labels"):  # the operator's own labels win (they are reserved anyway)
        template_meta["labels"] = {**pod["labels"], **(template_meta.get("labels") or {})}
    if pod.get("annotations"):
        template_meta["annotations"] = {
            **pod["annotations"],
            **(template_meta.get("annotations") or {}),
        }
    for key in ("serviceAccountName", "priorityClassName"):
        if pod.get(key):
            pod_spec[key] = str(pod[key])
    if pod.get("imagePullSecrets"):
        pod_spec["imagePullSecrets"] = [{"name": s["name"]} for s in pod["imagePullSecrets"]]
    extra = [dict(e) for e in pod.get("env") or []]
    if extra:
        for container in [*(pod_spec.get("initContainers") or []), *pod_spec["containers"]]:
            container["env"] = [*(container.get("env") or []), *extra]


# -- the platform's allow-lists (issue 26, item 7) ----------------------------------------
# The platform's allow-lists for what a model author may choose (issue 26, item 7).
#
# A PackratModel's author picks the image its pods run, ``spec.pod.serviceAccountName``,
# ``priorityClassName``, environment variables read from Secrets, and the storage its model is
# fetched from. The operator creates those pods with its own rights, so whoever may create
# PackratModels in a namespace may run any image there as any service account, and read any
# Secret of the namespace into a pod they control (see docs/security.md for the trust model).
# A platform team that grants PackratModel creation more widely than pod creation narrows it
# here: each list, when set (a chart value, a ``packrat operator`` flag), is what the operator
# accepts; a spec outside it is refused with ``Ready=False`` (reason ``PolicyRefused``) and a
# Warning event, nothing is created for it, and the last good configuration keeps serving.
# Unset, a list does not restrict (the behaviour before it existed), with one exception that
# no model needs: Kubernetes' own ``system-*`` priority classes (a pod with one preempts the
# cluster's critical pods) are refused unless a list names them (issue 38).
#
# Patterns: an image entry ending in ``*`` is a prefix (``registry.example.com/packrat/*``),
# any other entry is matched exactly (an image without its tag or digest also matches every tag
# and digest of it). The operator's own default image is always allowed. Storage hosts are the
# egress policy's (``--storage-host``, :mod:`packrat.runtime.egress`), enforced on every fetch
# and checked here too.

Allowed = tuple[str, ...] | None
SYSTEM_PRIORITY = "system-"  # system-node-critical, system-cluster-critical: Kubernetes' own


@dataclass(frozen=True, slots=True)
class ModelPolicy:
    """What model authors may choose; None: not restricted."""

    images: Allowed = None
    """Images ``spec.image`` may name (``--allow-image``): exact names, or prefixes ending in
    ``*``; a name without tag or digest allows every tag and digest of it. The operator's
    default image is always allowed."""
    service_accounts: Allowed = None
    """Names ``spec.pod.serviceAccountName`` may take (``--allow-service-account``)."""
    priority_classes: Allowed = None
    """Names ``spec.pod.priorityClassName`` may take (``--allow-priority-class``); unset, every
    class but Kubernetes' own ``system-*`` ones."""
    env_secrets: Allowed = None
    """Secrets ``spec.pod.env`` may read through ``secretKeyRef`` (``--allow-env-secret``)."""
    image_pull_secrets: Allowed = None
    """Secrets ``spec.pod.imagePullSecrets`` may name (``--allow-image-pull-secret``)."""

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
    priority = pod.get("priorityClassName")
    if policy.priority_classes is None and str(priority or "").startswith(SYSTEM_PRIORITY):
        out.append(
            f"spec.pod.priorityClassName {priority!r} is one of Kubernetes' own, which models "
            "may use only when the operator's allow-list names it"
        )
    if policy.image_pull_secrets is not None:
        for ref in pod.get("imagePullSecrets") or []:
            name = (ref or {}).get("name")
            if name not in policy.image_pull_secrets:
                out.append(
                    f"spec.pod.imagePullSecrets {name!r} is not among the pull Secrets the "
                    "operator allows"
                )
    if policy.env_secrets is not None:
        for item in pod.get("env") or []:
            ref = ((item or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            name = ref.get("name")
            if name is not None and name not in policy.env_secrets:
                out.append(
                    f"spec.pod.env {item.get('name')!r} reads Secret {name!r}, which the "
                    "operator does not allow in model environments"
                )
    if storage_hosts:
        out += _refused_hosts(spec, storage_hosts)
    return out


def _refused_hosts(spec: Mapping[str, Any], storage_hosts: Sequence[str]) -> list[str]:
    """Every http(s) URL a model's pods fetch (spec.model's and spec.canary.model's storageUri
    and uri) outside the storage hosts, its host read by the fetch's own parser."""
    out: list[str] = []
    canary = spec.get("canary")
    sources = [("spec.model", spec.get("model"))]
    if isinstance(canary, Mapping):
        sources.append(("spec.canary.model", canary.get("model")))
    for where, model in sources:
        for key in ("storageUri", "uri"):
            uri = model.get(key) if isinstance(model, Mapping) else None
            if not (isinstance(uri, str) and uri.startswith(("http://", "https://"))):
                continue
            try:
                host = split_url(uri).host
            except EgressError:
                continue  # invalid: the spec's validation says so
            if not host_matches(host, storage_hosts):
                out.append(f"{where}.{key}: {host} is not a storage host the operator allows")
    return out
