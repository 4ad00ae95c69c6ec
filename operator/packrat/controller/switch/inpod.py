"""The in-pod switch inside a reconcile pass: a plan change that keeps the pods' cores, model,
image and everything else their template is built from is applied in the running pods of the
active slot; anything else, or an in-pod switch that does not succeed on every pod, takes the
active-passive Deployment switch (:mod:`packrat.controller.switch.active_passive`).

One pass does it all, in this order, so that every step is idempotent and a pass that stops
anywhere (an API error, an operator restart) is repeated from the start by the next one:

1. the active slot's Deployment is ready (every wanted pod of the current template), and the
   model's admin token can be read;
2. the slot's plan ConfigMap gets the new plan, so a pod that starts from now on starts on it;
3. the slot's pods are listed (after 2: a pod not listed started on the new plan); every one
   must be ready, at least ``replicas`` of them;
4. the new plan is posted to every one at once (bounded by the switch's ready timeout and
   ``MAX_DEADLINE_SECONDS``); a pod that already serves it answers 200 at once, so a repeated
   pass only moves the pods that have not moved yet. The pass waits for the answers only
   briefly: a post still outstanding ends the pass (``InPodSwitchPending``) and the next pass
   asking the same picks the answers up, so pods that blackhole the post hold no reconcile
   thread;
5. every pod answered 200: ``status`` records the new plan (``servingHash``, ``plan``,
   ``servingSpec``, ``lastSwitch`` with ``mode: InPod``, ``switchHistory``).

When 1, 3 or 4 fails, the ConfigMap gets the served plan back and the caller starts the
Deployment switch, saying why in a Warning event (``InPodSwitchFailed``) and in the switch's
reason. Pods that did switch before another one failed serve the new plan until the slot is
retired by that switch (both plans are valid for the same cores).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.status import now_iso
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning.estimates import pod_address
from packrat.controller.serving import manifests as m
from packrat.controller.serving.admin_token import ensure_token
from packrat.controller.serving.pod_config import ensure_plan
from packrat.controller.serving.slots import Rendering, deployment_ready
from packrat.controller.switch.plan_poster import PlanPost, PodAnswer

MODE_INPOD = "InPod"
MODE_DEPLOYMENT = "Deployment"


Poster = Callable[[PlanPost], list[PodAnswer] | None]
"""Posts a plan to every URL: the answers, or None while the post is outstanding (a later call
with the same post picks it up); :class:`~packrat.controller.switch.plan_poster.PlanPoster`."""


class Pending:
    """The in-pod switch's answer while the plan post is outstanding: the pass ends, the
    served plan stays in status, and a later pass picks the answers up."""


PENDING = Pending()


@dataclass(frozen=True)
class PodClient:
    """How the operator reaches a serving pod: ``pod_url`` is a template with ``{ip}``,
    ``{pod}`` and ``{namespace}``; ``post`` sends a plan to several pods at once."""

    pod_url: str
    post: Poster


def slot_pods(pods: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(the ready pods, the names of the others) among a slot's pods; terminating pods are
    leaving and count as neither."""
    alive = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    ready = [pod for pod in alive if ab.pod_ready(pod)]
    others = [str(pod["metadata"]["name"]) for pod in alive if not ab.pod_ready(pod)]
    return ready, others


def failures(names: Sequence[str], answers: Sequence[PodAnswer]) -> list[str]:
    """``pod: status message`` for every pod that did not answer 200."""
    return [
        f"{name}: {answer.status or 'unreachable'} {answer.message}".strip()
        for name, answer in zip(names, answers, strict=True)
        if not answer.ok
    ]


def pending(p: Pass, *, desired: Rendering, pods: int) -> Pending:
    """The pass ends with the post outstanding (condition ``Reconfiguring``, reason
    ``InPodSwitchPending``), and asks for a pass soon."""
    message = f"posting plan {desired.plan.label} to {pods} pods of slot {p.status['activeSlot']}"
    p.cond("Reconfiguring", True, "InPodSwitchPending", message)
    p.result.in_progress()
    return PENDING


def switch_in_pod(
    p: Pass,
    *,
    active_dep: Mapping[str, Any] | None,
    served: Rendering,
    desired: Rendering,
    replicas: int,
    client: PodClient,
    timeout: float,
) -> str | Pending | None:
    """Switch the active slot's pods to ``desired`` in place: None when every pod serves it
    (and ``status`` says so), :data:`PENDING` while the post to the pods is outstanding (the
    desired plan stays in the ConfigMap), else why not (the served plan is back in the
    ConfigMap)."""
    slot = str(p.status["activeSlot"])
    if not deployment_ready(active_dep, replicas):
        return f"slot {slot} is not ready"
    token = ensure_token(p)
    if token is None:
        return f"no admin token in Secret {m.admin_token_name(p.name)}"
    if not ensure_plan(p, slot=slot, plan=desired.plan):
        return f"ConfigMap {m.plan_configmap_name(p.name, slot)} is not ours"
    listed = p.kube.list("pods", p.namespace, labels=m.service_selector(p.name, slot=slot))
    ready, others = slot_pods(listed)
    why: str | None = None
    if others or len(ready) < replicas:
        why = f"{len(ready)}/{max(replicas, len(ready) + len(others))} pods of slot {slot} ready"
    else:
        urls = [pod_address(client.pod_url, p.namespace, pod) for pod in ready]
        names = [str(pod["metadata"]["name"]) for pod in ready]
        start = time.monotonic()
        owner = f"{p.namespace}/{p.name}"
        answers = client.post(PlanPost(urls, desired.plan, token, timeout, owner))
        if answers is None:
            return pending(p, desired=desired, pods=len(names))
        failed = failures(names, answers)
        if failed:
            why = f"{len(failed)}/{len(names)} pods did not switch ({'; '.join(failed)[:400]})"
        else:
            # the whole post's time when the poster measured it (a post picked up by a later
            # pass took longer than this pass)
            seconds = max([time.monotonic() - start, *(a.seconds for a in answers)])
            record(p, served=served, desired=desired, pods=len(names), seconds=seconds)
            return None
    ensure_plan(p, slot=slot, plan=served.plan)
    return why


def record(p: Pass, *, served: Rendering, desired: Rendering, pods: int, seconds: float) -> None:
    """``status`` after a successful in-pod switch."""
    status = p.status
    slot = str(status["activeSlot"])
    old, new = served.plan, desired.plan
    reason = f"plan {old.label} -> {new.label}"
    if old.batch != new.batch:
        reason += f" (batch {old.batch} -> {new.batch})"
    status.set_serving(
        slot=slot,
        serving_hash=desired.serving_hash,
        plan=new,
        serving_spec=desired.spec.stored_spec(),
    )
    status.set_switch(None)  # an aborted Deployment switch to an older spec
    seconds = round(seconds, 3)
    last = {
        "time": now_iso(p.now),
        "reason": reason,
        "result": "Succeeded",
        "mode": MODE_INPOD,
        "fromSlot": slot,
        "toSlot": slot,
        "plan": new.label,
        "timeline": {"inPodSeconds": seconds},
    }
    status.record_switch(
        last,
        {
            **{k: v for k, v in last.items() if k != "timeline"},
            "fromBatch": old.batch,
            "toBatch": new.batch,
            "seconds": seconds,
        },
        limit=ab.HISTORY_LIMIT,
    )
    status.batch_settled(new.batch)
    p.result.switch_result = "succeeded"
    p.result.switch_seconds = seconds
    message = f"switched in place on slot {slot}, {pods} pods, in {seconds:.1f}s: {reason}"
    status.set_message(message)
    p.emit("Normal", "SwitchCompleted", message)
    p.cond("Reconfiguring", False, "SwitchedInPod", message)
