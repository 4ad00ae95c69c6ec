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
at once, and never holds a reconcile pass longer than a short inline wait: a post still
outstanding is picked up by a later pass. The request is idempotent: a pod that already
serves the plan answers 200 at once (``switched: false``), so a pass that finds some pods
switched and others not simply asks them all again. The pass that uses these is
:mod:`packrat.controller.switch.inpod`.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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
# a post kept for a later pass is forgotten after this long (its model never asked again)
KEEP_SECONDS = 600.0


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
    # the whole post's duration, from its submission to its last answer (0: not measured)
    seconds: float = field(default=0.0, compare=False)


def pod_answer(answer: Answer, *, seconds: float = 0.0) -> PodAnswer:
    """A pod's answer to the plan, read as untrusted input: its status, and a short message
    from a JSON object's ``message`` or ``plan`` (anything else, a list included: none)."""
    if answer.status == 0:
        message = f"unreachable: {answer.error}"[:300]
        return PodAnswer(ok=False, status=0, message=message, seconds=seconds)
    doc = read_json(answer, any_status=True)
    message = ""
    if isinstance(doc, dict):
        text = doc.get("message") or doc.get("plan") or ""
        message = text[:300] if isinstance(text, str) else ""
    return PodAnswer(
        ok=answer.status == 200, status=answer.status, message=message, seconds=seconds
    )


@dataclass(frozen=True, slots=True)
class PlanPost:
    """One post of ``plan`` to the pods at ``urls``, with the bearer ``token`` they were
    started with, bounded by ``timeout`` seconds in all; ``owner`` names the model it is for
    (a later post for the same owner supersedes it)."""

    urls: Sequence[str]
    plan: Plan
    token: str
    timeout: float
    owner: str = ""


Key = tuple[str, tuple[str, ...], bytes, str]


@dataclass(slots=True)
class _Post:
    """One post to a slot's pods, kept between passes while it is outstanding."""

    key: Key
    future: concurrent.futures.Future[list[Answer]]
    started: float  # time.monotonic() at submission
    ended: float | None = None  # ... when the last answer came (set on the pod client's loop)

    def end(self, _future: concurrent.futures.Future[list[Answer]]) -> None:
        self.ended = time.monotonic()


class PlanPoster:
    """Posts a plan to every pod of a slot at once, through the operator's one pod client,
    without holding a reconcile thread for the pods' sake.

    The post is submitted to the pod client's event loop and waited on for at most
    ``inline_wait`` seconds (an in-pod switch answers well within that); a post still
    outstanding then is kept, and the call answers None: *pending*. A later pass asking the
    same (the same model, pods, plan and token) picks up its answers once they are in; a pass
    asking something else for that model supersedes it (the old post is cancelled). The whole
    post is bounded by ``timeout`` (at most ``MAX_DEADLINE_SECONDS``), so a pending post always
    ends, with every pod's answer or "no answer within ...". At most one post per model is
    kept, and none past ``KEEP_SECONDS``; the posts are idempotent, so an operator that
    restarts (and forgets them) posts again. Each answer's ``seconds`` is the whole post's,
    from its submission to its last answer, whichever pass picked it up."""

    def __init__(self, fanout: PodFanout | None = None, *, inline_wait: float = 2.0) -> None:
        self.fanout = fanout or shared_fanout()
        self.inline_wait = inline_wait
        self._pending: dict[str, _Post] = {}
        self._lock = threading.Lock()

    def __call__(self, request: PlanPost) -> list[PodAnswer] | None:
        """Every pod's answer, in the order of its ``urls``; None while the post is
        outstanding."""
        owner = request.owner
        body, headers = plan_request(request.plan, token=request.token)
        targets = tuple(url.rstrip("/") + PATH for url in request.urls)
        key: Key = (owner, targets, body, request.token)
        with self._lock:
            self._forget_stale()
            post = self._pending.pop(owner, None)
            if post is not None and post.key != key:
                post.future.cancel()  # superseded: another plan, other pods or another token
                post = None
            if post is None:
                future = self.fanout.submit(
                    owner,
                    "POST",
                    targets,
                    body,
                    headers,
                    deadline=min(request.timeout, MAX_DEADLINE_SECONDS),
                    max_bytes=MAX_BYTES,
                )
                post = _Post(key, future, time.monotonic())
                future.add_done_callback(post.end)
        concurrent.futures.wait([post.future], timeout=self.inline_wait)
        if not post.future.done():
            with self._lock:
                self._pending[owner] = post
            return None
        try:
            answers = post.future.result()
        except concurrent.futures.CancelledError:
            answers = [Answer(0, error="cancelled") for _ in targets]
        seconds = (post.ended or time.monotonic()) - post.started
        return [pod_answer(answer, seconds=seconds) for answer in answers]

    def _forget_stale(self) -> None:
        """Drop posts started more than ``KEEP_SECONDS`` ago (a model deleted, or switched by
        other means, never asks again); called with the lock held."""
        horizon = time.monotonic() - KEEP_SECONDS
        for owner in [o for o, post in self._pending.items() if post.started < horizon]:
            self._pending.pop(owner).future.cancel()

    def outstanding(self) -> int:
        """How many models' posts are pending."""
        with self._lock:
            return len(self._pending)


def post_plan(url: str, plan: Plan, *, token: str, timeout: float) -> PodAnswer:
    """Ask the pod at ``url`` (``http://IP:PORT``, maybe with a path prefix) to switch to
    ``plan`` in place, waiting for its answer (at most ``timeout``); never raises."""
    request = PlanPost([url], plan, token=token, timeout=timeout)
    answers = PlanPoster(inline_wait=timeout + 5.0)(request)
    assert answers is not None  # done within its deadline, before the wait is over
    return answers[0]
