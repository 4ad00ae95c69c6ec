"""Canary rollout, the operator's side: run the canary slot beside the active one, tell the
active slot's pods to send it its share, watch what they report, and roll it back.

The API is ``spec.canary`` (:mod:`packrat.controller.core.options.canary`); the split happens in
the stable pods' dispatchers (:mod:`packrat.serve.dispatcher.canary`, which says why there).
One pass, at rest (no switch under way), each step idempotent:

1. a canary that should run (``trafficPercent`` above 0, not rolled back for this model):
   its plan ConfigMap, Deployment (the active slot's plan and cores, the canary's model) and
   Service are brought to what they should be; once its pods are ready, every ready pod of the
   active slot is told ``{url, percent}`` (``POST /admin/canary``), and every one's counts are
   read back from ``/status`` into ``status.canary`` (requests, errors, P99). Errors are every
   answer the stable pods could not use or that failed their client: 5xx, unreachable,
   timeouts, redirects, answers over the cap, 503/429 sheds and 4xx. The pass waits for the
   pods at most ``INLINE_WAIT_SECONDS``; a fan-out still outstanding then is kept and a later
   pass picks its answers up, so pods that never answer cost the model a share of the pod
   client, not a reconcile thread;
2. when ``rollback`` thresholds are set, enough canary requests were seen and the error rate
   or the P99 crossed its threshold, the canary is rolled back by itself: a Warning event
   ``CanaryRolledBack``, ``status.canary.phase: RolledBack`` for this canary model (it stays
   rolled back until ``spec.canary.model`` changes or ``spec.canary`` goes), then step 3;
3. a canary that should not run: every ready pod of the active slot is told percent 0 first,
   and only when all of them answered are the canary's Deployment, Service and ConfigMap
   deleted. So the active slot sends no request to a canary pod that is going away; one in
   flight then, or one from the pods of a slot still draining after a switch (they were not
   told), that the canary drops is served by the stable pod that sent it.

Promote (``spec.model`` := the canary's model, ``spec.canary`` removed) is a plan switch like
any model change; the canary keeps its share until that switch is done and the pass is at rest
again, then step 3 removes it. While a canary runs, the model is looked at every poll interval.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packrat.controller.api.children import keep
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.fanout import Answer, PodFanout, read_json, shared_fanout
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.options.canary import CanarySettings
from packrat.controller.core.status import CanaryRecord, now_iso
from packrat.controller.planning.estimates import pod_address
from packrat.controller.serving import canary as c
from packrat.controller.serving import manifests as m
from packrat.controller.serving.admin_token import ensure_token
from packrat.controller.serving.protection import release, terminating
from packrat.controller.serving.slots import Rendering, deployment_ready, ensure_deployment
from packrat.controller.switch.inpod import slot_pods

logger = logging.getLogger(__name__)

ADMIN_PATH = "/admin/canary"
MAX_BYTES = 128 * 1024  # a pod's /status (256 instances fit) or /admin/canary answer
DEADLINE_SECONDS = 5.0  # per fan-out, through the operator's one pod client
INLINE_WAIT_SECONDS = 1.0  # the most a pass waits for one fan-out (two per pass)
KEEP_SECONDS = 60.0  # an outstanding fan-out no pass asked for again is forgotten
Answers = list[Answer]


@dataclass
class CanaryClient:
    """How the operator reaches the pods for a canary, through its one pod client
    (:class:`packrat.controller.core.fanout.PodFanout`: a total deadline per request, byte
    caps, no redirects, a per-model cap): ``pod_url`` (``{ip}``, ``{pod}``, ``{namespace}``)
    for each stable pod, ``service_url`` (``{service}``, ``{namespace}``) for the canary's
    Service as the stable pods reach it.

    Each call waits at most ``inline_wait`` seconds and answers None while its fan-out is
    outstanding; the same call in a later pass (same model, pods and request) picks the
    answers up, another one supersedes it. Both requests are idempotent."""

    pod_url: str
    service_url: str
    fanout: PodFanout = field(default_factory=shared_fanout)
    inline_wait: float = INLINE_WAIT_SECONDS
    _kept: dict[tuple[str, str], tuple[Any, float, concurrent.futures.Future[Answers]]] = field(
        default_factory=dict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def configure(
        self,
        urls: Sequence[str],
        *,
        target: str | None,
        percent: int,
        ident: str,
        token: str,
        owner: str = "",
    ) -> Answers | None:
        body = json.dumps({"url": target, "percent": percent, "id": ident}).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        targets = [u.rstrip("/") + ADMIN_PATH for u in urls]
        return self._bounded(
            (owner, "configure"),
            (tuple(targets), body, token),
            lambda: self.fanout.submit(
                owner,
                "POST",
                targets,
                body,
                headers,
                deadline=DEADLINE_SECONDS,
                max_bytes=MAX_BYTES,
            ),
        )

    def stats(self, urls: Sequence[str], *, owner: str = "", token: str = "") -> Answers | None:
        targets = [u.rstrip("/") + "/status" for u in urls]
        headers = {"Authorization": f"Bearer {token}"} if token else {}  # the live counts'
        return self._bounded(
            (owner, "stats"),
            (tuple(targets), token),
            lambda: self.fanout.submit(
                owner,
                "GET",
                targets,
                None,
                headers,
                deadline=DEADLINE_SECONDS,
                max_bytes=MAX_BYTES,
            ),
        )

    def _bounded(
        self,
        slot: tuple[str, str],
        key: Any,
        submit: Callable[[], concurrent.futures.Future[Answers]],
    ) -> Answers | None:
        """The answers of the fan-out ``submit`` starts (or of the one kept for ``slot`` with
        the same ``key``), waited on at most :attr:`inline_wait`; None while outstanding."""
        now = time.monotonic()
        with self._lock:
            for stale in [k for k, v in self._kept.items() if now - v[1] > KEEP_SECONDS]:
                self._kept.pop(stale)[2].cancel()
            kept = self._kept.pop(slot, None)
            if kept is not None and kept[0] != key:
                kept[2].cancel()  # superseded: other pods or another request
                kept = None
            future = kept[2] if kept is not None else submit()
            started = kept[1] if kept is not None else now
        concurrent.futures.wait([future], timeout=self.inline_wait)
        if not future.done():
            with self._lock:
                self._kept[slot] = (key, started, future)
            return None
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            return None


def _failed(names: Sequence[str], answers: Sequence[Answer]) -> list[str]:
    return [
        f"{n}: {a.status or 'unreachable'} {a.error}".strip()
        for n, a in zip(names, answers, strict=True)
        if not a.ok
    ]


@dataclass(frozen=True, slots=True)
class Observed:
    """The canary's counts summed over the stable pods (P99: the worst pod's)."""

    requests: int
    errors: int
    p99_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def aggregate(answers: Sequence[Answer], *, url: str, ident: str) -> Observed:
    """Sum what each pod reports for canary ``ident`` at ``url`` (a pod reporting another
    canary, or junk, adds nothing: its counts are untrusted input)."""
    requests = errors = 0
    worst: float | None = None
    for answer in answers:
        doc = read_json(answer)
        stats = doc.get("canary") if isinstance(doc, dict) else None
        if not isinstance(stats, Mapping) or (stats.get("url"), stats.get("id")) != (url, ident):
            continue
        served = _count(stats.get("served"))
        # what the stable pods could not use (5xx, unreachable, redirects, too large), what
        # the canary shed (503, 429) and its 4xx: all count against it
        failed = sum(_count(stats.get(k)) for k in ("errors", "shed", "client_errors"))
        requests += served + failed
        errors += failed
        p99 = stats.get("p99Ms")
        if isinstance(p99, int | float) and not isinstance(p99, bool) and 0 <= p99 < 1e9:
            worst = float(p99) if worst is None else max(worst, float(p99))
    return Observed(requests=requests, errors=errors, p99_ms=worst)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def crossed(settings: CanarySettings, seen: Observed) -> str | None:
    """Why the canary must be rolled back (None: it may go on)."""
    if seen.requests < settings.min_requests:
        return None
    if settings.max_error_rate is not None and seen.error_rate > settings.max_error_rate:
        return (
            f"error rate {seen.error_rate:.1%} of {seen.requests} canary requests is above "
            f"{settings.max_error_rate:.1%}"
        )
    p99, limit = seen.p99_ms, settings.max_p99_ms
    if limit is not None and p99 is not None and p99 > limit:
        return f"P99 {p99:.1f} ms is above {limit:g} ms"
    return None


def reconcile_canary(p: Pass, *, model: ModelSpec, good: Rendering, client: CanaryClient) -> None:
    """Steps 1-3 of the module docstring for ``model`` at rest, serving ``good``."""
    settings = model.canary
    state = p.status.canary or CanaryRecord()
    rolled_back = settings is not None and state.rolled_back_for(settings.hash)
    if settings is None or settings.percent == 0 or rolled_back:
        _stop(p, client, keep=state if rolled_back else None)
        return
    _run(p, settings, good=good, client=client, state=state)


def _active_pods(p: Pass, client: CanaryClient) -> tuple[list[str], list[str]]:
    """(URLs, names) of the active slot's ready pods."""
    slot = str(p.status["activeSlot"])
    listed = p.kube.list("pods", p.namespace, labels=m.service_selector(p.name, slot=slot))
    ready, _ = slot_pods(listed)
    urls = [pod_address(client.pod_url, p.namespace, pod) for pod in ready]
    return urls, [str(pod["metadata"]["name"]) for pod in ready]


def _owner(p: Pass) -> str:
    return f"{p.namespace}/{p.name}"  # the pod client's per-model cap


def _run(
    p: Pass,
    settings: CanarySettings,
    *,
    good: Rendering,
    client: CanaryClient,
    state: CanaryRecord,
) -> None:
    p.result.in_progress()  # its counts are read every poll interval
    rendering = c.canary_rendering(good, settings)
    dep = _deploy(p, settings, rendering)
    if dep is None:
        return
    state = state.for_canary(settings.hash, now=now_iso(p.now)).running(
        model=settings.model,
        percent=settings.percent,
        ready_replicas=int((dep.get("status") or {}).get("readyReplicas") or 0),
    )
    if not deployment_ready(dep, settings.replicas):
        p.status.set_canary(state.starting())
        return
    token = ensure_token(p)
    if token is None:
        return
    target = c.canary_url(client.service_url, rendering)
    urls, names = _active_pods(p, client)
    answers = client.configure(
        urls,
        target=target,
        percent=settings.percent,
        ident=settings.hash,
        token=token,
        owner=_owner(p),
    )
    counts = client.stats(urls, owner=_owner(p), token=token)
    if answers is None or counts is None:  # outstanding: a later pass picks them up
        return
    failed = _failed(names, answers)
    seen = aggregate(counts, url=target, ident=settings.hash)
    if not state.progressing and not failed:
        p.emit(
            "Normal",
            "CanaryStarted",
            f"canary {c.canary_name(p.name)} takes {settings.percent}% of the predictions of "
            f"{len(urls)} pods",
        )
    state = state.counted(
        told_all=not failed,
        requests=seen.requests,
        errors=seen.errors,
        p99_ms=seen.p99_ms,
        message="; ".join(failed)[:400] if failed else "",
    )
    p.status.set_canary(state)
    why = crossed(settings, seen)
    if why is not None:
        message = f"canary rolled back: {why}"
        p.emit("Warning", "CanaryRolledBack", message)
        rolled = state.rolled_back(message)
        p.status.set_canary(rolled)
        _stop(p, client, keep=rolled)


def _deploy(p: Pass, settings: CanarySettings, rendering: Rendering) -> dict[str, Any] | None:
    """The canary's Deployment and Service brought to what they should be; its Deployment,
    or None while there is none to use (one deleted by hand still going, one not ours)."""
    name = c.canary_name(p.name)
    current = p.kube.get("deployments", p.namespace, name)
    if current is not None and terminating(current):  # deleted by hand: let it go, then anew
        if owned_by(current, name=p.name, uid=p.obj["metadata"].get("uid")):
            release(p.kube, p.namespace, current)
        return None
    dep = ensure_deployment(
        p, current, slot=c.SLOT, rendering=rendering, replicas=settings.replicas
    )
    if dep is None or not _ensure_service(p):
        return None
    return dep


def _stop(p: Pass, client: CanaryClient, *, keep: CanaryRecord | None) -> None:
    """Stop the canary's share on every stable pod, then delete its objects. ``keep``: the
    status to keep (a rolled-back canary), else ``status.canary`` goes once all is gone."""
    name = c.canary_name(p.name)
    uid = p.obj["metadata"].get("uid")
    dep = p.kube.get("deployments", p.namespace, name)
    svc = p.kube.get("services", p.namespace, name)
    plan = p.kube.get("configmaps", p.namespace, m.plan_configmap_name(p.name, c.SLOT))
    ours = [o for o in (dep, svc, plan) if o is not None and owned_by(o, name=p.name, uid=uid)]
    kept = p.status.canary or CanaryRecord()
    if not ours and not kept.traffic_percent:
        _settle(p, keep)
        return
    token = ensure_token(p)
    urls, names = _active_pods(p, client)
    if token is not None and urls:
        answers = client.configure(
            urls, target=None, percent=0, ident="", token=token, owner=_owner(p)
        )
        if answers is None:  # outstanding: nothing is deleted before every pod answered
            p.result.in_progress()
            return
        failed = _failed(names, answers)
        if failed:  # a pod may still send to the canary: keep it, ask again
            p.result.in_progress()
            stopping = "stopping: " + "; ".join(failed)[:400]
            p.status.set_canary(kept.stopping(stopping))
            return
    if dep is not None and dep in ours:
        release(p.kube, p.namespace, dep)
        p.kube.delete("deployments", p.namespace, name)
    if svc is not None and svc in ours:
        p.kube.delete("services", p.namespace, name)
    if plan is not None and plan in ours:
        p.kube.delete("configmaps", p.namespace, m.plan_configmap_name(p.name, c.SLOT))
    if keep is None:
        p.emit("Normal", "CanaryRemoved", f"canary {name} removed; the stable pods serve all")
    _settle(p, keep)


def _settle(p: Pass, keep: CanaryRecord | None) -> None:
    p.status.set_canary(None if keep is None else keep.settled())


def _ensure_service(p: Pass) -> bool:
    """The canary's Service (selector: the canary slot); False when it is not ours."""
    want = c.canary_service(p.obj)
    kept = keep(p.kube, "services", p.namespace, want, ours=p.owns, drift=_selector_drift)
    if not kept.ours:
        p.conflict("Service", want["metadata"]["name"])
    return kept.ours


def _selector_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    if (current.get("spec") or {}).get("selector") == want["spec"]["selector"]:
        return {}
    return {"spec": {"selector": want["spec"]["selector"]}}
