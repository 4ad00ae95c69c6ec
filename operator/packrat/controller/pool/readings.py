"""What the pool pods say they serve: each ready pod's ``/pool/status``, read as hostile input.

A pool pod runs an image its pool's author chose, so its answer is untrusted: read through
the operator's one pod client (:class:`packrat.controller.core.fanout.PodFanout`: a total
deadline, a byte cap, no redirects), parsed strictly (:func:`read_json`), and every value
checked: a model name is a DNS label the pool asked the pod to host, counters are
non-negative integers, times finite and within the years a timestamp can name (a
``last_use`` of 1e20 once failed every pass of the pool when written as a date). Anything
else is dropped, never copied into status. Every pod of the pool is read at once, under one
total deadline: a pass waits at most ``DEADLINE_SECONDS`` (plus the client's margin) for all
of them, however many are slow or blackholed (it once read them one after the other).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from packrat.controller.api.kube import KubeApi
from packrat.controller.core.fanout import PodFanout, read_json
from packrat.controller.planning.autobatch import pod_ready
from packrat.controller.planning.estimates import pod_address
from packrat.controller.pool import manifests as pm

MAX_BYTES = 256 * 1024  # 512 models at about 300 B each, with room
DEADLINE_SECONDS = 2.0
_MARGIN_SECONDS = 1.0  # the reader's own wait beyond the requests' deadline
MAX_PODS = 64
MAX_REPLICAS = 4  # ready pods read per pool pod (one replica, a second while it rolls)
MAX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z: the last second a date can name
_COUNTERS = ("resident_bytes", "file_bytes", "requests", "cold_starts", "read_bytes")


@dataclass(frozen=True, slots=True)
class Hosted:
    """One model as the pod that hosts it reports it."""

    pod: str
    resident_bytes: int
    file_bytes: int
    requests: int
    cold_starts: int
    last_use: float  # seconds since the epoch; 0 before the first request
    config: str = ""  # the digest of the config the pod serves ("" when it says none)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pod": self.pod,
            "residentBytes": self.resident_bytes,
            "fileBytes": self.file_bytes,
            "requests": self.requests,
            "coldStarts": self.cold_starts,
        }
        if self.last_use > 0:
            out["lastUse"] = _iso(self.last_use)
        return out


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
    return value if ok else None


def parse_status(pod: str, doc: Any, expected: Collection[str]) -> dict[str, Hosted]:
    """The models of one pod's ``/pool/status`` that it was asked to host, checked."""
    models = doc.get("models") if isinstance(doc, Mapping) else None
    if not isinstance(models, Mapping):
        return {}
    digest = doc.get("config_digest") if isinstance(doc, Mapping) else None
    config = digest if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) else ""
    out = {}
    for name, entry in list(models.items())[: 2 * len(expected) + 1]:
        if name not in expected or not isinstance(entry, Mapping):
            continue
        counters = [_count(entry.get(k)) for k in _COUNTERS]
        last = entry.get("last_use")
        if not isinstance(last, int | float) or isinstance(last, bool):
            continue
        if any(c is None for c in counters) or not (math.isfinite(last) and last <= MAX_TIME):
            continue
        resident, size, requests, cold, _read = (int(c or 0) for c in counters)
        out[name] = Hosted(pod, resident, size, requests, cold, max(0.0, float(last)), config)
    return out


def _agreed(last: Hosted, replicas: list[Hosted]) -> Hosted:
    """``last``, its config digest kept only when every ready replica reports the same one
    (a replica still on an older config may drop the model a moment later)."""
    if all(h.config == last.config for h in replicas):
        return last
    return replace(last, config="")


class PoolReader:
    """Reads every ready pool pod's ``/pool/status`` (``pod_url``: a template with ``{ip}``,
    ``{pod}`` and ``{namespace}``)."""

    def __init__(self, kube: KubeApi, *, pod_url: str, fanout: PodFanout) -> None:
        self.kube, self.pod_url, self.fanout = kube, pod_url, fanout

    def __call__(
        self,
        namespace: str,
        pool: str,
        expected: Mapping[str, Collection[str]],
        *,
        token: str | None = None,
    ) -> dict[str, dict[str, Hosted]]:
        """Pool pod name -> the models it serves now (``expected``: pod -> the models the
        pool asked it to host; a pod with none is not read). Unreachable pods: absent.
        ``token``: the pool's admin token, sent to its own pods only (``/pool/status``
        answers 401 without it)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        pods = self.kube.list("pods", namespace, labels=pm.pool_labels(pool))
        by_pod: dict[str, list[str]] = {}
        for p in pods:  # the pods of the pool pods it asked (no others crowd them out)
            key = (p["metadata"].get("labels") or {}).get(pm.LABEL_POOL_POD)
            if not (isinstance(key, str) and expected.get(key) and pod_ready(p)):
                continue
            if key in by_pod or len(by_pod) < MAX_PODS:
                urls = by_pod.setdefault(key, [])
                if len(urls) < MAX_REPLICAS:
                    urls.append(pod_address(self.pod_url, namespace, p))
        # every pod at once (each pool pod its own owner: one blackholed pod holds none of
        # its siblings' slots), and one wait for all of them
        started = {
            key: self.fanout.submit(
                f"pool/{namespace}/{pool}/{key}",
                "GET",
                [f"{url.rstrip('/')}/pool/status" for url in found],
                None,
                headers,
                deadline=DEADLINE_SECONDS,
                max_bytes=MAX_BYTES,
            )
            for key, found in by_pod.items()
        }
        concurrent.futures.wait(started.values(), timeout=DEADLINE_SECONDS + _MARGIN_SECONDS)
        out: dict[str, dict[str, Hosted]] = {}
        for key, future in started.items():
            if not future.done() or future.cancelled():
                future.cancel()  # past the deadline: unreachable, like a pod that is down
                continue
            # a model is served by the pod when every ready replica of it says so (a pod
            # rolling to a new config has its old replica ready beside the new one)
            seen = [parse_status(key, read_json(a), expected[key]) for a in future.result()]
            common = set.intersection(*(set(s) for s in seen)) if seen else set()
            out[key] = {n: _agreed(seen[-1][n], [s[n] for s in seen]) for n in sorted(common)}
        return out
