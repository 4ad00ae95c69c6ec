"""kopf's peering objects, created by the operator itself before kopf starts.

With ``--peering NAME`` kopf's replicas elect one active operator through a KopfPeering object
in every watched namespace (or one ClusterKopfPeering cluster-wide). kopf only patches that
object; when it is missing every replica believes itself alone and all of them handle the same
models. The Helm chart cannot render the object: on a fresh cluster its kind does not exist
until the release's CRDs are created, and Helm refuses a release whose objects have no kind
("no matches for kind ClusterKopfPeering ... ensure CRDs are installed first"). So the CRDs come
with the CRD charts (``crds/kopfpeering.yaml``, ``crds/clusterkopfpeering.yaml``) and the
operator creates the objects here, idempotently: an existing one (another replica was first) is
left as it is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

GROUP = "kopf.dev"
VERSION = "v1"
NAMESPACED = ("KopfPeering", "kopfpeerings")
CLUSTER = ("ClusterKopfPeering", "clusterkopfpeerings")
REQUEST_TIMEOUT = 30.0  # seconds, per call
LABELS = {
    "app.kubernetes.io/managed-by": "packrat-operator",
    "app.kubernetes.io/part-of": "packrat",
}


class PeeringError(Exception):
    """The peering objects cannot be created (one line for the operator's log)."""


@dataclass(frozen=True, slots=True)
class PeeringTarget:
    """One peering object: ``namespace`` None for the cluster-wide one."""

    name: str
    namespace: str | None

    @property
    def kind(self) -> str:
        return (CLUSTER if self.namespace is None else NAMESPACED)[0]

    @property
    def plural(self) -> str:
        return (CLUSTER if self.namespace is None else NAMESPACED)[1]

    def where(self) -> str:
        return f"{self.kind} {self.name}" + (f" in {self.namespace}" if self.namespace else "")


def peering_targets(
    name: str, namespaces: Sequence[str], *, clusterwide: bool
) -> list[PeeringTarget]:
    """The peering objects kopf uses for this scope. A glob pattern (``models-*``) names no
    namespace we could create in: left out (and logged by :func:`ensure_peering`)."""
    if clusterwide:
        return [PeeringTarget(name, None)]
    exact = sorted({ns for ns in namespaces if not any(c in ns for c in "*?[")})
    return [PeeringTarget(name, ns) for ns in exact]


def peering_body(target: PeeringTarget) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": target.name, "labels": dict(LABELS)}
    if target.namespace is not None:
        metadata["namespace"] = target.namespace
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": target.kind, "metadata": metadata}


def ensure_peering(api: Any, targets: Sequence[PeeringTarget]) -> list[PeeringTarget]:
    """Create each missing peering object through ``api`` (a kubernetes
    ``CustomObjectsApi``); returns the ones created. A 409 (it exists) is success; a 404 means
    the CRDs are not installed; anything else is a :class:`PeeringError`."""
    from kubernetes.client.exceptions import ApiException

    created: list[PeeringTarget] = []
    for target in targets:
        body = peering_body(target)
        try:
            if target.namespace is None:
                api.create_cluster_custom_object(
                    GROUP, VERSION, target.plural, body, _request_timeout=REQUEST_TIMEOUT
                )
            else:
                api.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    target.namespace,
                    target.plural,
                    body,
                    _request_timeout=REQUEST_TIMEOUT,
                )
        except ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                raise PeeringError(
                    f"cannot create {target.where()}: the kopf peering CRDs are not installed "
                    "(install the packrat-crds chart, or the operator chart without --skip-crds)"
                ) from None
            raise PeeringError(
                f"cannot create {target.where()}: HTTP {exc.status} {exc.reason}"
            ) from None
        logger.info("created %s", target.where())
        created.append(target)
    return created


def keep_peering(
    api: Any, targets: Sequence[PeeringTarget], *, every: float, stop: threading.Event
) -> None:
    """Re-create a peering object that disappears (a ``helm upgrade`` from a chart version that
    rendered it deletes it, possibly after this replica started), every ``every`` seconds
    until ``stop`` is set. Errors are logged, never raised: the election keeps running."""
    while not stop.wait(every):
        try:
            for target in ensure_peering(api, targets):
                logger.warning("re-created %s (it had been deleted)", target.where())
        except PeeringError as exc:
            logger.warning("peering: %s", exc)
