"""The in-pod switch, the operator's side: when it applies, and asking one pod to do it.

A plan change that keeps the pod's cores, model, image and everything else the serving
pods are built from (the common case: only the batch size changed) can be applied inside
the running pods (:mod:`packrat.serve.pod.inpod`): no new pod, no new JVM, no Service change.
Anything else keeps the active-passive Deployment switch
(:mod:`packrat.controller.switch.active_passive`).

:func:`switchable` decides that, purely. :func:`post_plan` asks one pod, with the bearer
token the pod was started with, and reads its answer as untrusted input (bounded, no
redirects, one total deadline) through the operator's one pod client, as
:mod:`packrat.controller.planning.estimates` does; :class:`PlanPoster` asks every pod of a slot
at once. The request is idempotent: a pod that already serves the plan answers 200
at once (``switched: false``), so a pass that finds some pods switched and others not simply
asks them all again. The pass that uses these is :mod:`packrat.controller.switch.inpod`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from packrat.controller.core.fanout import Answer, PodFanout, read_json, shared_fanout
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.plans import layout, to_pod
from packrat.plan.optimizer import Plan

logger = logging.getLogger(__name__)

PATH = "/admin/plan"
MAX_BYTES = 8 * 1024
# the whole post to a slot's pods: an in-pod switch takes well under a second (see
# docs/measurements.md); a pod that takes longer is switched by the Deployment switch
MAX_DEADLINE_SECONDS = 30.0


def switchable(
    current_spec: ModelSpec, current_plan: Plan, desired_spec: ModelSpec, desired_plan: Plan
) -> bool:
    """Whether going from the current plan to the desired one can happen inside the pods:
    the plans differ, their cores do not, and nothing else the pods are built from does
    (model, image, resources, TorchServe settings, scheduling)."""
    if layout(current_plan) == layout(desired_plan):
        return False
    if current_plan.cpus != desired_plan.cpus:
        return False
    cpus = desired_plan.cpus
    return current_spec.template_hash(cpus) == desired_spec.template_hash(cpus)


def plan_request(plan: Plan, *, token: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``POST /admin/plan`` for ``plan``."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return json.dumps(to_pod(plan), sort_keys=True).encode(), headers


@dataclass(frozen=True, slots=True)
class PodAnswer:
    """What one pod said: ``ok`` when it serves the new plan now."""

    ok: bool
    status: int  # HTTP status, 0 when it could not be reached
    message: str


def pod_answer(answer: Answer) -> PodAnswer:
    """A pod's answer to the plan, read as untrusted input: its status, and a short message
    from a JSON object's ``message`` or ``plan`` (anything else, a list included: none)."""
    if answer.status == 0:
        return PodAnswer(ok=False, status=0, message=f"unreachable: {answer.error}"[:300])
    doc = read_json(answer, any_status=True)
    message = ""
    if isinstance(doc, dict):
        text = doc.get("message") or doc.get("plan") or ""
        message = text[:300] if isinstance(text, str) else ""
    return PodAnswer(ok=answer.status == 200, status=answer.status, message=message)


class PlanPoster:
    """Posts a plan to every pod of a slot at once, through the operator's one pod client;
    the whole post is bounded by ``timeout`` (at most ``MAX_DEADLINE_SECONDS``)."""

    def __init__(self, fanout: PodFanout | None = None) -> None:
        self.fanout = fanout or shared_fanout()

    def __call__(
        self,
        urls: Sequence[str],
        plan: Plan,
        *,
        token: str,
        timeout: float,
        owner: str = "",
    ) -> list[PodAnswer]:
        """Every pod's answer, in the order of ``urls``."""
        body, headers = plan_request(plan, token=token)
        answers = self.fanout.post(
            owner,
            [url.rstrip("/") + PATH for url in urls],
            body,
            headers,
            deadline=min(timeout, MAX_DEADLINE_SECONDS),
            max_bytes=MAX_BYTES,
        )
        return [pod_answer(answer) for answer in answers]


def post_plan(url: str, plan: Plan, *, token: str, timeout: float) -> PodAnswer:
    """Ask the pod at ``url`` (``http://IP:PORT``, maybe with a path prefix) to switch to
    ``plan`` in place; never raises."""
    return PlanPoster()([url], plan, token=token, timeout=timeout)[0]
