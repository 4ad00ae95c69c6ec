"""Reading the serving pods' batch-size estimates (autoBatch), safely.

A serving pod's image is chosen by the PackratModel's author, so its ``/status`` answer is
untrusted input: at most ``MAX_BYTES`` are read, redirects are not followed (``http.client``
never follows them), all pods are read concurrently under one total ``deadline``, and the
caller reads them before a pass, never while a pass holds anything.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.planning.autobatch import Reading, parse_estimate, pod_ready

logger = logging.getLogger(__name__)

MAX_BYTES = 8 * 1024
DEADLINE_SECONDS = 2.0
MAX_PODS = 64


def get_json(url: str, path: str, *, timeout: float, max_bytes: int, what: str) -> Any | None:
    """``GET {url}{path}`` from a serving pod, as untrusted input: the JSON document, or None
    (not plain http, unreachable, slow, not 200, over ``max_bytes``, junk). ``http.client``
    never follows redirects; ``path`` may carry a query."""
    parts = urllib.parse.urlsplit(url.rstrip("/") + path)
    if parts.scheme != "http" or not parts.hostname:
        return None
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        body = resp.read(max_bytes + 1)
        if len(body) > max_bytes:
            return None
        return json.loads(body)
    except (OSError, ValueError, http.client.HTTPException, RecursionError) as exc:
        logger.debug("no %s from %s: %s", what, url, exc)
        return None
    finally:
        conn.close()


def fetch_estimate(url: str, *, timeout: float) -> int | None:
    """``GET {url}/status``: the estimate, or None (unreachable, slow, large, redirect, junk)."""
    doc = get_json(url, "/status", timeout=timeout, max_bytes=MAX_BYTES, what="estimate")
    return None if doc is None else parse_estimate(doc)


def ready_pods(kube: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    """The ready pods the model's Service selects (at most ``MAX_PODS``); none when the
    Service or the pods cannot be read."""
    svc = kube.get("services", namespace, name)
    selector = ((svc or {}).get("spec") or {}).get("selector")
    if not selector:
        return []
    try:
        pods = kube.list("pods", namespace, labels=selector)
    except Exception as exc:  # e.g. 403 without pods permission
        logger.debug("cannot list pods of %s/%s: %s", namespace, name, exc)
        return []
    return [p for p in pods if pod_ready(p)][:MAX_PODS]


def pod_address(template: str, namespace: str, pod: Mapping[str, Any]) -> str:
    """``template`` with the pod's ``{ip}``, ``{pod}`` and ``{namespace}`` filled in."""
    return template.format(
        ip=pod["status"]["podIP"], pod=pod["metadata"]["name"], namespace=namespace
    )


class EstimateReader:
    """Reads every ready serving pod's estimate (the pods the Service selects).

    ``pod_url`` is a template with ``{ip}``, ``{pod}`` and ``{namespace}``; ``service_url``
    one with ``{service}`` and ``{namespace}``. When no ready pod can be listed, it reads one
    estimate through the Service.
    """

    def __init__(
        self,
        kube: KubeApi,
        *,
        pod_url: str,
        service_url: str,
        deadline: float = DEADLINE_SECONDS,
        workers: int = 8,
    ) -> None:
        self.kube = kube
        self.pod_url = pod_url
        self.service_url = service_url
        self.deadline = deadline
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="estimates")

    def ready_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return ready_pods(self.kube, namespace, name)

    def _read_all(self, urls: list[str]) -> list[int]:
        start = time.monotonic()
        futures = [self._pool.submit(fetch_estimate, url, timeout=self.deadline) for url in urls]
        done, _ = wait(futures, timeout=max(0.0, self.deadline - (time.monotonic() - start)))
        return [v for f in futures if f in done and (v := f.result()) is not None]

    def __call__(
        self, namespace: str, name: str, pods: list[dict[str, Any]] | None = None
    ) -> Reading | None:
        """``pods``: the model's ready pods when the caller has listed them already."""
        if pods is None:
            pods = self.ready_pods(namespace, name)
        if pods:
            urls = [pod_address(self.pod_url, namespace, pod) for pod in pods]
            values = self._read_all(urls)
            return Reading(tuple(values), "pods") if values else None
        values = self._read_all([self.service_url.format(service=name, namespace=namespace)])
        return Reading((values[0],), "service") if values else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
