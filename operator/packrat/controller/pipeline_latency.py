"""The measured end-to-end P99 of a pipeline, from its router pods' latency histograms.

Each router pod exports ``packrat_pipeline_request_duration_seconds`` (every query it
answered, from receiving it to answering it). The operator reads ``/metrics`` of every ready
pod the pipeline's Service selects, adds their buckets and takes the 99th percentile the way
Prometheus' ``histogram_quantile`` does (linear within the bucket it falls in): the P99 over
every query the current router pods have answered, for ``status.measuredP99Ms``. Fewer than
``MIN_QUERIES`` queries measure nothing. A router pod's image is the operator's, but its
answer is still read as untrusted input: at most ``MAX_BYTES``, no redirects, one total
deadline for all pods, read before a pass, never during one.
"""

from __future__ import annotations

import http.client
import logging
import math
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait

from prometheus_client.parser import text_string_to_metric_families

from packrat.controller.estimates import pod_address, ready_pods
from packrat.controller.kube import KubeApi

logger = logging.getLogger(__name__)

METRIC = "packrat_pipeline_request_duration_seconds"
MAX_BYTES = 512 * 1024
DEADLINE_SECONDS = 2.0
MIN_QUERIES = 20

Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def get_text(url: str, path: str, *, timeout: float, max_bytes: int = MAX_BYTES) -> str | None:
    """``GET {url}{path}``: the body as text, or None (not plain http, unreachable, slow,
    not 200, over ``max_bytes``)."""
    parts = urllib.parse.urlsplit(url.rstrip("/") + path)
    if parts.scheme != "http" or not parts.hostname:
        return None
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path)
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        body = resp.read(max_bytes + 1)
        return None if len(body) > max_bytes else body.decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        logger.debug("no metrics from %s: %s", url, exc)
        return None
    finally:
        conn.close()


def parse_buckets(text: str, pipeline: str) -> Buckets | None:
    """The end-to-end histogram's cumulative buckets for ``pipeline``; None for junk."""
    out: Buckets = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name != METRIC:
                continue
            for sample in family.samples:
                if sample.name != f"{METRIC}_bucket":
                    continue
                if sample.labels.get("pipeline") != pipeline:
                    continue
                le, value = float(sample.labels["le"]), float(sample.value)
                if math.isnan(le) or not math.isfinite(value) or value < 0:
                    return None
                out[le] = out.get(le, 0.0) + value
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        logger.debug("unreadable router metrics: %s", exc)
        return None
    return out or None


def add(total: Buckets, more: Mapping[float, float]) -> None:
    for le, count in more.items():
        total[le] = total.get(le, 0.0) + count


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """``histogram_quantile(q, buckets)`` in seconds; None when there are no observations.
    A quantile in the ``+Inf`` bucket is the largest finite bound (as Prometheus)."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


class RouterLatency:
    """Reads every ready router pod's histogram; ``pod_url`` as for the estimates."""

    def __init__(
        self, kube: KubeApi, *, pod_url: str, deadline: float = DEADLINE_SECONDS, workers: int = 4
    ) -> None:
        self.kube = kube
        self.pod_url = pod_url
        self.deadline = deadline
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="router-metrics")

    def __call__(self, namespace: str, name: str) -> float | None:
        """The measured end-to-end P99 in ms, or None (too few queries, nothing readable)."""
        pods = ready_pods(self.kube, namespace, name)
        if not pods:
            return None
        urls = [pod_address(self.pod_url, namespace, pod) for pod in pods]
        start = time.monotonic()
        futures = [
            self._pool.submit(get_text, url, "/metrics", timeout=self.deadline) for url in urls
        ]
        done, _ = wait(futures, timeout=max(0.0, self.deadline - (time.monotonic() - start)))
        total: Buckets = {}
        for future in futures:
            text = future.result() if future in done else None
            buckets = parse_buckets(text, name) if text else None
            if buckets:
                add(total, buckets)
        count = total.get(math.inf, 0.0)
        if count < MIN_QUERIES:
            return None
        p99 = quantile(total, 0.99)
        return None if p99 is None else round(p99 * 1000.0, 3)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
