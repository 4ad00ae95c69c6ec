"""Reading the serving pods' batch-size estimates (autoBatch), safely.

A serving pod's image is chosen by the PackratModel's author, so its ``/status`` answer is
untrusted input. Every read goes through the operator's one pod client
(:class:`packrat.controller.core.fanout.PodFanout`: a total deadline per request, at most
``MAX_BYTES``, no redirects, a pool one model cannot monopolise), all pods at once under one
``deadline``; the estimate must be an integer in 1..``MAX_ESTIMATE`` (anything else, an
``Infinity`` or a 4000-digit number included, is no estimate). The caller reads them before a
pass, never while a pass holds anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.core.fanout import PodFanout, read_json, shared_fanout
from packrat.controller.planning.autobatch import (
    PodEstimate,
    Reading,
    parse_pod_estimate,
    pod_ready,
    reading_of,
)
from packrat.controller.serving.admin_token import read_token

logger = logging.getLogger(__name__)

# A pod's /status grows with its instances (about 125 B each, plus the plan): 64 instances
# answered 9,179 B, over the 8 KiB this once was, and autoBatch got nothing (issue 38). 128 KiB
# holds a pod of 256 single-core instances several times over.
MAX_BYTES = 128 * 1024
DEADLINE_SECONDS = 2.0
TOKEN_SECONDS = 60.0
MAX_PODS = 64


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


@dataclass(eq=False, kw_only=True)
class PodReader:
    """What a reader of every ready pod of a Service keeps: the API it lists the pods with,
    the ``pod_url`` template (``{ip}``, ``{pod}``, ``{namespace}``), the deadline of each
    fan-out, the operator's one pod client and a lock over what it remembers per model.
    A reader's own settings and memory are the fields its subclass adds."""

    kube: KubeApi = field(kw_only=False)
    pod_url: str
    deadline: float = DEADLINE_SECONDS
    fanout: PodFanout = field(default_factory=shared_fanout)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)


@dataclass(eq=False, kw_only=True)
class EstimateReader(PodReader):
    """Reads every ready serving pod's estimate (the pods the Service selects).

    ``pod_url`` is a template with ``{ip}``, ``{pod}`` and ``{namespace}``; ``service_url``
    one with ``{service}`` and ``{namespace}``. When no ready pod can be listed, it reads one
    estimate through the Service.
    """

    service_url: str
    # per model, the pod addresses its last read went to (what peek() reads again);
    # bounded by the models this operator serves, forgotten with a deleted model
    _last: dict[str, tuple[list[str], dict[str, str]]] = field(
        default_factory=dict, init=False, repr=False
    )
    # per model, when its token was read, and the token
    _tokens: dict[str, tuple[float, str | None]] = field(
        default_factory=dict, init=False, repr=False
    )

    def _token(self, namespace: str, name: str) -> str | None:
        """The model's admin token, read at most every ``TOKEN_SECONDS`` (a token a minute
        old is still one the pods accept: they take the current and the previous one, and
        the schedule rotates at most every 600 s)."""
        key, now = f"{namespace}/{name}", time.monotonic()
        with self._lock:
            kept = self._tokens.get(key)
        if kept is not None and now - kept[0] < TOKEN_SECONDS:
            return kept[1]
        token = read_token(self.kube, namespace, name)
        with self._lock:
            self._tokens[key] = (now, token)
        return token

    def ready_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return ready_pods(self.kube, namespace, name)

    def _read_all(
        self, owner: str, urls: list[str], headers: Mapping[str, str] | None = None
    ) -> list[PodEstimate]:
        answers = self.fanout.get(
            owner,
            [url.rstrip("/") + "/status" for url in urls],
            deadline=self.deadline,
            max_bytes=MAX_BYTES,
            headers=headers,
        )
        values = [parse_pod_estimate(read_json(answer)) for answer in answers]
        for answer, value in zip(answers, values, strict=True):
            if value is None:  # for whoever wonders why autoBatch waits
                logger.debug("no batch-size estimate from a pod of %s: %s", owner, answer.error)
        return [v for v in values if v is not None]

    def __call__(
        self,
        namespace: str,
        name: str,
        pods: list[dict[str, Any]] | None = None,
        *,
        token: tuple[str | None] | None = None,
    ) -> Reading | None:
        """``pods``: the model's ready pods when the caller has listed them already;
        ``token``: ``(the model's token,)`` when the caller has read it already."""
        owner = f"{namespace}/{name}"
        if pods is None:
            pods = self.ready_pods(namespace, name)
        if pods:
            urls = [pod_address(self.pod_url, namespace, pod) for pod in pods]
            # the model's own pods show their live counts (the fast trigger's evidence) only
            # with its token; the Service, which an author could point elsewhere, gets none
            (value,) = token or (self._token(namespace, name),)
            headers = {"Authorization": f"Bearer {value}"} if value else {}
            with self._lock:
                self._last[owner] = (urls, headers)
            return reading_of(self._read_all(owner, urls, headers), "pods")
        with self._lock:
            self._last.pop(owner, None)
        service = self.service_url.format(service=name, namespace=namespace)
        return reading_of(self._read_all(owner, [service])[:1], "service")

    def peek(self, namespace: str, name: str) -> Reading | None:
        """The estimates of the pods the last read of ``name`` went to, read again without
        asking the API server (the fast trigger's reads between passes); None when that read
        listed no pods, or when a pod does not answer with one (the pass lists them again)."""
        owner = f"{namespace}/{name}"
        with self._lock:
            urls, headers = self._last.get(owner) or ([], {})
        if not urls:
            return None
        pods = self._read_all(owner, urls, headers)
        return reading_of(pods, "pods") if len(pods) == len(urls) else None

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._last.pop(f"{namespace}/{name}", None)
            self._tokens.pop(f"{namespace}/{name}", None)
