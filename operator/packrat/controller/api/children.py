"""Keeping a child object in shape, written once (KServe's reconciler per child kind, in a
function): read it, create it when missing, leave it alone when it is not ours, and patch back
what drifted from what we set.

Every child of a model (its Service, slot Deployments, plan ConfigMaps, admin token Secret,
canary Service) and of a pipeline (stage models, router ConfigMap and Deployment, Service)
goes through :func:`keep`; what differs per kind is only what counts as drift (a ``Drift``
function: the merge patch that puts back what we set, empty when nothing drifted).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.drift import covers, merge_patch
from packrat.controller.api.kube import KubeApi

Drift = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
"""(the object as it is, the object as we want it) -> the merge patch that puts back what we
set (empty: in shape)."""


class Outcome(enum.Enum):
    CREATED = "created"  # it was missing (or ``created`` False: made meanwhile by another)
    PATCHED = "patched"  # it drifted and was put back
    KEPT = "kept"  # in shape, or settled by the caller's ``settle``
    NOT_OURS = "not_ours"  # under our name but not ours: left untouched


@dataclass(frozen=True)
class Kept:
    """What :func:`keep` did, and the object as it now is (None when not ours)."""

    outcome: Outcome
    obj: dict[str, Any] | None
    created: bool = False  # this call created it

    @property
    def ours(self) -> bool:
        return self.outcome is not Outcome.NOT_OURS


_READ: Any = object()


def keep(
    kube: KubeApi,
    resource: str,
    namespace: str,
    want: Mapping[str, Any],
    *,
    ours: Callable[[Mapping[str, Any]], bool],
    drift: Drift | None = None,
    current: Mapping[str, Any] | None = _READ,
    settle: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None,
) -> Kept:
    """Bring the child ``want`` names to ``want``: created when missing (``current`` None, or
    read when not given), never touched when ``ours`` says it is not ours, else patched by
    ``drift``'s patch when there is one. ``settle``: for kinds with steps of their own before
    the patch (a Deployment being deleted, an immutable field changed), called with our
    object; an answer ends there."""
    name = want["metadata"]["name"]
    if current is _READ:
        current = kube.get(resource, namespace, name)
    if current is None:
        if kube.create(resource, namespace, want):
            return Kept(Outcome.CREATED, dict(want), created=True)
        current = kube.get(resource, namespace, name)  # made meanwhile: see whose it is
        if current is None:
            return Kept(Outcome.CREATED, dict(want))
    if not ours(current):
        return Kept(Outcome.NOT_OURS, None)
    if settle is not None and (settled := settle(current)) is not None:
        return Kept(Outcome.KEPT, settled)
    patch = drift(current, want) if drift is not None else {}
    if patch:
        patched = kube.patch(resource, namespace, name, patch)
        return Kept(Outcome.PATCHED, patched)
    return Kept(Outcome.KEPT, dict(current))


def labels_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """Our labels, when one of them is missing or changed."""
    labels = (current.get("metadata") or {}).get("labels") or {}
    if covers(labels, want["metadata"]["labels"]):
        return {}
    return {"metadata": {"labels": dict(want["metadata"]["labels"])}}


def service_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """A Service's selector exactly ours (extra keys removed), our ports and our labels."""
    spec = current.get("spec") or {}
    patch: dict[str, Any] = {}
    selector = spec.get("selector") or {}
    if selector != want["spec"]["selector"]:
        patch["spec"] = {"selector": merge_patch(selector, want["spec"]["selector"])}
    if not covers(spec.get("ports"), want["spec"]["ports"]):
        patch.setdefault("spec", {})["ports"] = want["spec"]["ports"]
    return {**patch, **labels_drift(current, want)}
