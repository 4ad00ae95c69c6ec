"""The in-pod switch, the operator's side: when it applies, and asking one pod to do it.

A plan change that keeps the pod's cores, model, image and everything else the serving
pods are built from (the common case: only the batch size changed) can be applied inside
the running pods (:mod:`packrat.serve.pod.inpod`): no new pod, no new JVM, no Service change.
Anything else keeps the active-passive Deployment switch
(:mod:`packrat.controller.switch.active_passive`).

:func:`switchable` decides that, purely. :func:`post_plan` asks one pod, with the bearer
token the pod was started with, and reads its answer as untrusted input (bounded, no
redirects), as :mod:`packrat.controller.planning.estimates` does; :class:`PlanPoster` asks every pod
of a slot at once. The request is idempotent: a pod that already serves the plan answers 200
at once (``switched: false``), so a pass that finds some pods switched and others not simply
asks them all again. The pass that uses these is :mod:`packrat.controller.switch.inpod`.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.model import ModelSpec
from packrat.controller.core.plans import wire_plan

logger = logging.getLogger(__name__)

PATH = "/admin/plan"
MAX_BYTES = 8 * 1024
PLAN_KEYS = ("cpus", "batch", "instances")


def _pod_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    return {k: plan.get(k) for k in PLAN_KEYS}


def switchable(
    current_spec: ModelSpec,
    current_plan: Mapping[str, Any],
    desired_spec: ModelSpec,
    desired_plan: Mapping[str, Any],
) -> bool:
    """Whether going from the current plan to the desired one can happen inside the pods:
    the plans differ, their cores do not, and nothing else the pods are built from does
    (model, image, resources, TorchServe settings, scheduling)."""
    if _pod_plan(current_plan) == _pod_plan(desired_plan):
        return False
    if current_plan.get("cpus") != desired_plan.get("cpus"):
        return False
    cpus = desired_plan.get("cpus")
    return current_spec.template_hash(cpus) == desired_spec.template_hash(cpus)


def plan_request(plan: Mapping[str, Any], *, token: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``POST /admin/plan`` for ``plan`` (``status.plan`` form)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return json.dumps(wire_plan(plan), sort_keys=True).encode(), headers


@dataclass(frozen=True, slots=True)
class PodAnswer:
    """What one pod said: ``ok`` when it serves the new plan now."""

    ok: bool
    status: int  # HTTP status, 0 when it could not be reached
    message: str


def post_plan(url: str, plan: Mapping[str, Any], *, token: str, timeout: float) -> PodAnswer:
    """Ask the pod at ``url`` (``http://IP:PORT``, maybe with a path prefix) to switch to
    ``plan`` in place; never raises."""
    parts = urllib.parse.urlsplit(url.rstrip("/") + PATH)
    if parts.scheme != "http" or not parts.hostname:
        return PodAnswer(ok=False, status=0, message=f"not a plain http address: {url}"[:300])
    body, headers = plan_request(plan, token=token)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", parts.path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read(MAX_BYTES + 1)
        try:
            doc = json.loads(raw[:MAX_BYTES]) if len(raw) <= MAX_BYTES else {}
        except (ValueError, RecursionError):
            doc = {}
        message = str(doc.get("message") or doc.get("plan") or "")[:300]
        return PodAnswer(ok=resp.status == 200, status=resp.status, message=message)
    except (OSError, http.client.HTTPException) as exc:
        logger.debug("in-pod switch: %s unreachable: %s", url, exc)
        return PodAnswer(ok=False, status=0, message=f"unreachable: {exc}"[:300])
    finally:
        conn.close()


class PlanPoster:
    """Posts a plan to several pods at once (one thread each, at most ``workers``)."""

    def __init__(self, *, workers: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inpod")

    def __call__(
        self, urls: Sequence[str], plan: Mapping[str, Any], *, token: str, timeout: float
    ) -> list[PodAnswer]:
        """Every pod's answer, in the order of ``urls``."""
        futures = [
            self._pool.submit(post_plan, url, plan, token=token, timeout=timeout) for url in urls
        ]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
