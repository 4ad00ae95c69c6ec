"""Kubernetes I/O for the operator: a small JSON-dict client over the official client's transport.

The reconcile logic works on plain dicts (the same dicts the builders produce), so it talks
to the API through this thin layer: get/create/patch/delete/list/log with the kubeconfig or
in-cluster credentials of the ``kubernetes`` package. Label selectors are sent to the server
and also applied here, so a server that ignores them (the kmock emulator) gives the same answer.
The ``KubeApi`` protocol lets unit tests drive the reconcile logic with an in-memory fake.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from packrat.controller.api.crd import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0  # seconds; a hung call must not hold a model's reconcile lock forever

# resource name -> (API prefix, plural)
RESOURCES: dict[str, tuple[str, str]] = {
    "packratmodels": (f"/apis/{GROUP}/{VERSION}", PLURAL),
    "packratpipelines": (f"/apis/{GROUP}/{VERSION}", "packratpipelines"),
    "packratpools": (f"/apis/{GROUP}/{VERSION}", "packratpools"),
    "configmaps": ("/api/v1", "configmaps"),
    "services": ("/api/v1", "services"),
    "pods": ("/api/v1", "pods"),
    "events": ("/api/v1", "events"),
    "secrets": ("/api/v1", "secrets"),
    "jobs": ("/apis/batch/v1", "jobs"),
    "deployments": ("/apis/apps/v1", "deployments"),
}


class KubeError(Exception):
    """An unexpected answer from the API server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi(Protocol):
    """What the reconcile logic needs from the API server."""

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, resource: str, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create; False when it already exists (409)."""
        ...

    def patch(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """A JSON merge patch; None when the object is gone (404)."""
        ...

    def patch_status(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """The same through the status subresource (what a reconcile pass writes)."""
        ...

    def delete(self, resource: str, namespace: str, name: str) -> bool: ...

    def list(
        self, resource: str, namespace: str, *, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    def read_log(self, namespace: str, pod: str, *, container: str) -> str | None: ...


def matches(obj: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in (labels or {}).items())


def _path(resource: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural = RESOURCES[resource]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name is not None:
        path += f"/{name}"
    if sub is not None:
        path += f"/{sub}"
    return path


class Kube:
    """``KubeApi`` over ``kubernetes.client.ApiClient`` (blocking; called from sync handlers)."""

    def __init__(self, api_client: Any | None = None) -> None:
        if api_client is None:
            import kubernetes

            try:
                kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
            api_client = kubernetes.client.ApiClient()
        self._api = api_client

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        raw: bool = False,
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json, */*", "Content-Type": content_type}
        _, url, headers, body_out, _ = self._api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(
            method, url, header_params=headers, body=body_out, _request_timeout=REQUEST_TIMEOUT
        )
        data = response.read()
        status = int(response.status)
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
        if raw or status >= 400:
            return status, text
        return status, json.loads(text) if text else None

    def _check(self, status: int, payload: Any, *, allow: tuple[int, ...] = ()) -> None:
        if status >= 400 and status not in allow:
            message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
            raise KubeError(status, message[:500])

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        status, payload = self._call("GET", _path(resource, namespace, name))
        if status == 404:
            return None
        self._check(status, payload)
        result: dict[str, Any] = payload
        return result

    def create(self, resource: str, namespace: str, body: Mapping[str, Any]) -> bool:
        status, payload = self._call("POST", _path(resource, namespace), body=dict(body))
        if status == 409:
            return False
        self._check(status, payload)
        return True

    def patch(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return self._merge_patch(_path(resource, namespace, name), patch)

    def patch_status(
        self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        return self._merge_patch(_path(resource, namespace, name, "status"), patch)

    def _merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        status, payload = self._call(
            "PATCH", path, body=dict(patch), content_type="application/merge-patch+json"
        )
        if status == 404:
            return None
        self._check(status, payload)
        result: dict[str, Any] | None = payload if isinstance(payload, dict) else None
        return result

    def delete(self, resource: str, namespace: str, name: str) -> bool:
        status, payload = self._call(
            "DELETE",
            _path(resource, namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )
        if status == 404:
            return False
        self._check(status, payload)
        return True

    def list(
        self, resource: str, namespace: str, *, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        query = []
        if labels:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items())))
        status, payload = self._call("GET", _path(resource, namespace), query=query)
        self._check(status, payload)
        items = payload.get("items") or [] if isinstance(payload, dict) else []
        return [item for item in items if matches(item, labels)]

    def read_log(self, namespace: str, pod: str, *, container: str) -> str | None:
        query = [("container", container)]
        status, text = self._call(
            "GET", _path("pods", namespace, pod, "log"), query=query, raw=True
        )
        if status == 404:
            return None
        self._check(status, text)
        return str(text)
