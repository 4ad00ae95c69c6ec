"""The serving finalizer: a deleted serving Deployment keeps its pods until it may go.

Every serving Deployment the operator creates carries ``packrat.dev/serving``
(``manifests.FINALIZER_SERVING``). Kubernetes' default (background) cascading delete then only
marks it (``deletionTimestamp``): the garbage collector deletes its ReplicaSet, and with it the
pods, only once the Deployment itself is gone, so the pods keep serving through the Service.
The pass decides when to let it go (``failover``): at once for a passive slot, or when there
is nothing left to protect (a foreground delete removes the pods first); for the active slot
only after the last good configuration serves from the other slot. A model being deleted, or
gone, lets every one of its Deployments go (``release_orphans``), so no delete hangs on us.

Finalizer lists are written with a JSON merge patch that carries the object's
``resourceVersion``: the API server refuses it (409) if anyone changed the object since it was
read, so another controller's finalizer is never dropped by a stale list.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.api.ownership import owned_by
from packrat.controller.serving import manifests as m

logger = logging.getLogger(__name__)

FINALIZER = m.FINALIZER_SERVING
# set by the API server on a foreground delete until the garbage collector deleted the pods
FOREGROUND = "foregroundDeletion"


def finalizers(obj: Mapping[str, Any] | None) -> list[str]:
    return [str(f) for f in ((obj or {}).get("metadata") or {}).get("finalizers") or []]


def terminating(obj: Mapping[str, Any] | None) -> bool:
    """Deleted, waiting for its finalizers (a Deployment still listed, its pods may serve)."""
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))


def protected(obj: Mapping[str, Any] | None) -> bool:
    return FINALIZER in finalizers(obj)


def pods_going(obj: Mapping[str, Any] | None) -> bool:
    """A foreground delete: the garbage collector deletes the pods before the Deployment."""
    return terminating(obj) and FOREGROUND in finalizers(obj)


def held(meta: Mapping[str, Any], event_type: str | None) -> bool:
    """A watch event's Deployment is deleted and still held by our finalizer (waiting on us
    to let it go)."""
    if event_type == "DELETED" or not meta.get("deletionTimestamp"):
        return False
    return FINALIZER in (meta.get("finalizers") or [])


def finalizers_patch(obj: Mapping[str, Any], new: list[str]) -> dict[str, Any]:
    """The merge patch that sets ``metadata.finalizers`` to ``new`` if ``obj`` is unchanged."""
    meta: dict[str, Any] = {"finalizers": new}
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if version:
        meta["resourceVersion"] = version
    return {"metadata": meta}


def protect_patch(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """Adds our finalizer to a Deployment made without it (by an older operator); None when it
    has it, or when it is being deleted (the API server refuses new finalizers then)."""
    if protected(obj) or terminating(obj):
        return None
    return finalizers_patch(obj, [*finalizers(obj), FINALIZER])


def release(kube: KubeApi, namespace: str, obj: Mapping[str, Any]) -> bool:
    """Remove our finalizer (the garbage collector may then finish); True if it was there."""
    if not protected(obj):
        return False
    rest = [f for f in finalizers(obj) if f != FINALIZER]
    name = obj["metadata"]["name"]
    kube.patch("deployments", namespace, name, finalizers_patch(obj, rest))
    logger.info("released deployment %s/%s", namespace, name)
    return True


def release_orphans(
    kube: KubeApi, namespace: str, model: str, *, live: Mapping[str, Any] | None
) -> list[str]:
    """Let go every serving Deployment of ``model`` that the live model ``live`` does not own
    (all of them when ``live`` is None: the model is gone or being deleted). Returns the names
    released."""
    labels = {m.LABEL_MODEL: model, "app.kubernetes.io/managed-by": m.MANAGER}
    uid = str((live or {}).get("metadata", {}).get("uid") or "") or None
    released = []
    for dep in kube.list("deployments", namespace, labels=labels):
        if live is not None and owned_by(dep, name=model, uid=uid):
            continue
        if release(kube, namespace, dep):
            released.append(str(dep["metadata"]["name"]))
    return released
