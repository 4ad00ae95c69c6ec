"""Reading the arrivals the serving pods saw (``GET /arrivals``), for the tuner, safely.

Like the batch-size estimates, a pod's answer is untrusted input: at most ``MAX_BYTES`` are
read, redirects are not followed, every pod is read concurrently under one ``deadline``, and
the reading happens before a pass. The reader keeps, per pod, the newest timestamp it has
seen and asks only for what came after (in memory: a restarted operator starts from "now",
since older arrivals say nothing about the load to come). A pod that does not answer is
skipped; when none answers the reading is None and the tuner decides nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.planning.autoscale import Arrivals
from packrat.controller.planning.estimates import get_json, pod_address, ready_pods

logger = logging.getLogger(__name__)

MAX_BYTES = 2 * 1024 * 1024
DEADLINE_SECONDS = 2.0


def parse_arrivals(doc: Any) -> list[float] | None:
    """Timestamps from a pod's ``/arrivals`` document; None when it is not one."""
    try:
        base = float(doc["base"])
        offsets = doc["offsets_ms"]
        if not isinstance(offsets, list) or not math.isfinite(base):
            return None
        times = [base + float(o) / 1000.0 for o in offsets]
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(t) for t in times):
        return None
    return times


def fetch_arrivals(url: str, *, after: float, timeout: float) -> list[float] | None:
    """``GET {url}/arrivals?after=``: the timestamps, or None (unreachable, large, junk)."""
    path = f"/arrivals?after={after:.6f}"
    doc = get_json(url, path, timeout=timeout, max_bytes=MAX_BYTES, what="arrivals")
    return None if doc is None else parse_arrivals(doc)


class ArrivalReader:
    """Reads and merges the new arrivals of every ready serving pod of a model."""

    def __init__(
        self,
        kube: KubeApi,
        *,
        pod_url: str,
        deadline: float = DEADLINE_SECONDS,
        workers: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.pod_url = pod_url
        self.deadline = deadline
        self.clock = clock
        self._cursors: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arrivals")

    def __call__(
        self, namespace: str, name: str, pods: list[dict[str, Any]] | None = None
    ) -> Arrivals | None:
        """``pods``: the model's ready pods when the caller has listed them already."""
        if pods is None:
            pods = ready_pods(self.kube, namespace, name)
        if not pods:
            return None
        now = self.clock()
        jobs = []
        for pod in pods:
            key = (namespace, name, str(pod["metadata"]["name"]))
            with self._lock:
                after = self._cursors.setdefault(key, now)
            url = pod_address(self.pod_url, namespace, pod)
            jobs.append(
                (key, self._pool.submit(fetch_arrivals, url, after=after, timeout=self.deadline))
            )
        done, _ = wait([f for _, f in jobs], timeout=self.deadline)
        merged: list[float] = []
        answered = 0
        for key, future in jobs:
            times = future.result() if future in done else None
            if times is None:
                continue
            answered += 1
            if times:
                with self._lock:
                    self._cursors[key] = max(self._cursors.get(key, 0.0), times[-1])
                merged.extend(times)
        self._forget_gone(namespace, name, {str(p["metadata"]["name"]) for p in pods})
        if not answered:
            return None
        merged.sort()
        return Arrivals(times=merged, pods=answered)

    def _forget_gone(self, namespace: str, name: str, alive: set[str]) -> None:
        with self._lock:
            for key in [k for k in self._cursors if k[:2] == (namespace, name)]:
                if key[2] not in alive:
                    del self._cursors[key]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
