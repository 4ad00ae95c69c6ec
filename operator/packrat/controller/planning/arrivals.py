"""Reading the arrivals the serving pods saw (``GET /arrivals``), for the tuner, safely.

Like the batch-size estimates, a pod's answer is untrusted input, read through the operator's
one pod client (:class:`packrat.controller.core.fanout.PodFanout`: a total deadline, at most
``MAX_BYTES``, no redirects, a pool one model cannot monopolise), every pod concurrently
under one ``deadline``; a document that is not an object with a finite ``base`` and a list of
finite offsets (at most ``MAX_OFFSETS``; ``Infinity`` and 400-digit numbers are not) is no
reading from that pod. ``/arrivals`` needs the model's admin token (from the Secret the
operator owns, :func:`~packrat.controller.serving.admin_token.read_token`); without one
nothing is asked. A pipeline router's ``/arrivals`` (a stage's ``spec.autoscaling.ingress``)
needs the pipeline's token, sent only when the Service named is the pipeline's own. The
reading happens before a pass. The reader keeps, per pod, the
newest timestamp it has seen, asks only for what came after and keeps only that (a pod that
ignores the cursor is not counted twice; in memory: a restarted operator starts from "now",
since older arrivals say nothing about the load to come). A pod
that does not answer is skipped; when none answers the reading is None and the tuner decides
nothing.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from packrat.controller.api.crd import PIPELINE_KIND
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.fanout import read_json
from packrat.controller.planning.autoscale import Arrivals
from packrat.controller.planning.estimates import PodReader, pod_address, ready_pods
from packrat.controller.serving.admin_token import Holder, read_token
from packrat.controller.serving.manifests import router_token_name
from packrat.plan.pipeline.feedback import thin, thin_phase

logger = logging.getLogger(__name__)

MAX_BYTES = 2 * 1024 * 1024


MAX_OFFSETS = 200_000
# an arrival stamped further ahead of the operator's clock than this is no arrival (a pod's
# clock far off, or its model's code): counted, and its time kept as the pod's cursor, it
# would hide every real arrival of that pod until then
CLOCK_SKEW_SECONDS = 60.0
# what the pods answer is only what came more than this after the cursor (their
# ``ArrivalLog.after``: timestamps travel with microsecond resolution); the reader keeps the
# same rule itself, so a pod or a proxy that drops ``?after=`` (answering its whole log
# every read) cannot feed the tuner the same arrivals again
RESOLUTION_SECONDS = 1e-6


def _finite(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 1e15
    )


def parse_arrivals(doc: Any) -> list[float] | None:
    """Timestamps from a pod's ``/arrivals`` document; None when it is not one (not an
    object, a base or an offset that is not a finite number, too many offsets)."""
    if not isinstance(doc, dict):
        return None
    base, offsets = doc.get("base"), doc.get("offsets_ms")
    if not _finite(base) or not isinstance(offsets, list) or len(offsets) > MAX_OFFSETS:
        return None
    if not all(_finite(o) for o in offsets):
        return None
    start = float(base)
    times = [start + float(o) / 1000.0 for o in offsets]
    return times if all(math.isfinite(t) for t in times) else None


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC)


def _reads(who: str, reader: str) -> bool:
    """Whether cursor owner ``who`` (a model's name, or ``reader@service``) is ``reader``'s."""
    return who == reader or who.startswith(f"{reader}@")


def _path(after: float) -> str:
    return f"/arrivals?after={after:.6f}"


@dataclass(eq=False, kw_only=True)
class ArrivalReader(PodReader):
    """Reads and merges the new arrivals of every ready serving pod of a model."""

    clock: Callable[[], float] = time.time
    # per (namespace, cursor owner, pod): the newest arrival seen
    _cursors: dict[tuple[str, str, str], float] = field(
        default_factory=dict, init=False, repr=False
    )
    # per (namespace, reader@service): the share left over by the ingress thinned so far
    _phases: dict[tuple[str, str], float] = field(default_factory=dict, init=False, repr=False)

    def ingress(
        self, namespace: str, service: str, *, reader: str, factor: float
    ) -> Arrivals | None:
        """A pipeline router's new arrivals (Service ``service``) thinned to ``reader``'s scale
        factor, each read carrying on from the share the reads before left over (thinned
        one read at a time, reads of 5 at 0.1 would keep none)."""
        seen = self(namespace, service, reader=reader)
        if seen is None:
            return None
        key = (namespace, f"{reader}@{service}")
        with self._lock:
            phase = self._phases.get(key, 0.0)
            self._phases[key] = thin_phase(len(seen.times), factor, phase)
        return Arrivals(times=thin(seen.times, factor, phase), pods=seen.pods)

    def forget(self, namespace: str, reader: str) -> None:
        """Drop a deleted model's cursors and ingress shares."""
        with self._lock:
            for key in [k for k in self._cursors if k[0] == namespace and _reads(k[1], reader)]:
                del self._cursors[key]
            for phase in [k for k in self._phases if k[0] == namespace and _reads(k[1], reader)]:
                del self._phases[phase]

    def __call__(
        self,
        namespace: str,
        name: str,
        pods: list[dict[str, Any]] | None = None,
        *,
        reader: str | None = None,
        token: tuple[str | None] | None = None,
    ) -> Arrivals | None:
        """``pods``: the ready pods of Service ``name`` when the caller has listed them
        already. ``reader``: whose cursors these are when it is not ``name`` (several stage
        models read one pipeline router's arrivals, each from where it left off).
        ``token``: ``(the model's token,)`` when the caller has read it already."""
        if pods is None:
            pods = ready_pods(self.kube, namespace, name)
        if not pods:
            return None
        now = self.clock()
        keys, urls, cursors = [], [], []
        who = f"{reader or name}@{name}" if reader else name
        for pod in pods:
            key = (namespace, who, str(pod["metadata"]["name"]))
            with self._lock:
                after = self._cursors.setdefault(key, now)
            keys.append(key)
            cursors.append(after)
            urls.append(f"{pod_address(self.pod_url, namespace, pod).rstrip('/')}{_path(after)}")
        headers: dict[str, str] = {}
        if reader is None:  # the model's own pods: they want its token
            (value,) = token or (read_token(self.kube, namespace, name, _utc(now)),)
            if value is None:
                return None  # no token of ours: the pods would answer 401, and nothing is sent
            headers["Authorization"] = f"Bearer {value}"
        elif (value := self._router_token(namespace, name, now)) is not None:
            headers["Authorization"] = f"Bearer {value}"
        # else not a pipeline's routers (spec.autoscaling.ingress names any Service): asked
        # without a token, as before; the model's token is never sent to a Service its
        # author chose
        answers = self.fanout.get(
            f"{namespace}/{name}",
            urls,
            deadline=self.deadline,
            max_bytes=MAX_BYTES,
            headers=headers,
        )
        merged: list[float] = []
        answered = 0
        for key, after, answer in zip(keys, cursors, answers, strict=True):
            times = parse_arrivals(read_json(answer))
            if times is None:
                continue
            times = [t for t in times if after + RESOLUTION_SECONDS < t <= now + CLOCK_SKEW_SECONDS]
            answered += 1
            if times:
                with self._lock:
                    newest = max(times)
                    self._cursors[key] = max(self._cursors.get(key, 0.0), newest)
                merged.extend(times)
        self._forget_gone(namespace, who, {str(p["metadata"]["name"]) for p in pods})
        if not answered:
            return None
        merged.sort()
        return Arrivals(times=merged, pods=answered)

    def _router_token(self, namespace: str, service: str, now: float) -> str | None:
        """The pipeline's token when ``service`` is a PackratPipeline's Service (under its
        name, owned by it) and its token Secret is the pipeline's; None otherwise."""
        svc = self.kube.get("services", namespace, service)
        if svc is None or not owned_by(svc, name=service, uid=None, kind=PIPELINE_KIND):
            return None
        holder = Holder(PIPELINE_KIND, router_token_name(service))
        return read_token(self.kube, namespace, service, _utc(now), holder=holder)

    def _forget_gone(self, namespace: str, name: str, alive: set[str]) -> None:
        with self._lock:
            for key in [k for k in self._cursors if k[:2] == (namespace, name)]:
                if key[2] not in alive:
                    del self._cursors[key]
