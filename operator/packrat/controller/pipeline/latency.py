"""The measured end-to-end P99 of a pipeline, from its router pods' latency histograms.

Each router pod exports ``packrat_pipeline_request_duration_seconds`` (every query it
answered, from receiving it to answering it). The operator reads ``/metrics`` of every ready
pod the pipeline's Service selects and takes the 99th percentile the way Prometheus'
``histogram_quantile`` does (linear within the bucket it falls in) over the queries answered
in a trailing window (``WINDOW_SECONDS``, 5 minutes), for ``status.measuredP99Ms``: the
buckets' increase over the window, as ``histogram_quantile(0.99, increase(...[5m]))``.

The increase is taken per pod (:class:`LatencyWindow`, pure) from the readings kept in
memory: against the newest reading at least a window old; for a pod started within the
window, against zero (all it answered is in the window); for an older pod first read less
than a window ago, against its first reading (the window is shorter until a whole window has
been watched; on the first reading such a pod adds nothing). A pod whose counts went down
was restarted: its counts since then are its increase. Fewer than ``MIN_QUERIES`` queries in
the window measure nothing (``status.measuredP99Ms`` is removed: it would describe old
traffic). A router pod's image is the operator's, but its answer is still read as untrusted
input: at most ``MAX_BYTES``, no redirects, one total deadline for all pods, read before a
pass, never during one, through the operator's one pod client
(:class:`packrat.controller.core.fanout.PodFanout`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from packrat.controller.core.status import parse_time
from packrat.controller.planning.estimates import PodReader, pod_address, ready_pods

logger = logging.getLogger(__name__)

METRIC = "packrat_pipeline_request_duration_seconds"
MAX_BYTES = 512 * 1024
MIN_QUERIES = 20
WINDOW_SECONDS = 300.0

Buckets = dict[float, float]  # upper bound (s) -> cumulative count
EDGES_METRIC = "packrat_pipeline_edges_taken"
ANSWERS_METRIC = "packrat_pipeline_stage_answers"
MAX_SERIES = 1024  # edge and stage series taken from one router pod
MAX_COUNT = float(2**53)


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


@dataclass(frozen=True, slots=True)
class EdgeCounts:
    """The router's per-edge and per-stage counters (cumulative, or an increase): queries
    that took each edge, answers each stage gave (the measured scale factors' evidence)."""

    taken: dict[tuple[str, str], float] = field(default_factory=dict)
    answered: dict[str, float] = field(default_factory=dict)


def parse_edge_counts(text: str, pipeline: str) -> EdgeCounts | None:
    """``packrat_pipeline_edges_taken_total`` and ``..._stage_answers_total`` for
    ``pipeline``; None for junk (a value not finite, negative or beyond 2^53, too many
    series)."""
    out = EdgeCounts()
    try:
        for family in text_string_to_metric_families(text):
            if family.name not in (EDGES_METRIC, ANSWERS_METRIC):
                continue
            for sample in family.samples:
                labels = sample.labels
                if sample.name != f"{family.name}_total" or labels.get("pipeline") != pipeline:
                    continue
                value = float(sample.value)
                if not 0 <= value <= MAX_COUNT:  # NaN fails too
                    return None
                if family.name == EDGES_METRIC:
                    out.taken[(str(labels["src"]), str(labels["dst"]))] = value
                else:
                    out.answered[str(labels["stage"])] = value
                if len(out.taken) + len(out.answered) > MAX_SERIES:
                    return None
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        logger.debug("unreadable router metrics: %s", exc)
        return None
    return out


def counts_increase(now: EdgeCounts, before: EdgeCounts | None) -> EdgeCounts:
    """What ``now`` adds to ``before``: all of ``now`` when there is nothing before or any
    count went down (the router pod restarted)."""
    if (
        before is None
        or any(v < before.taken.get(k, 0.0) for k, v in now.taken.items())
        or any(v < before.answered.get(k, 0.0) for k, v in now.answered.items())
    ):
        return EdgeCounts(dict(now.taken), dict(now.answered))
    return EdgeCounts(
        {k: v - before.taken.get(k, 0.0) for k, v in now.taken.items()},
        {k: v - before.answered.get(k, 0.0) for k, v in now.answered.items()},
    )


def add_counts(total: EdgeCounts, more: EdgeCounts) -> None:
    for key, value in more.taken.items():
        total.taken[key] = total.taken.get(key, 0.0) + value
    for stage, value in more.answered.items():
        total.answered[stage] = total.answered.get(stage, 0.0) + value


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


@dataclass(frozen=True, slots=True)
class Measured:
    """The end-to-end latency over the trailing window: its P99 (ms; None below
    ``MIN_QUERIES`` queries) and how many queries the window holds."""

    p99_ms: float | None
    queries: int
    edges: EdgeCounts | None = None  # the counters' increase since the last reading


@dataclass(frozen=True, slots=True)
class PodReading:
    """One router pod's histogram at one reading; ``started``: the pod's start (epoch s)."""

    buckets: Buckets
    started: float | None = None


def _count(buckets: Mapping[float, float]) -> float:
    return float(buckets.get(math.inf, 0.0))


def increase(now: Mapping[float, float], before: Mapping[float, float] | None) -> Buckets:
    """Per bucket, what ``now`` adds to ``before`` (all of ``now`` after a reset or with
    nothing before)."""
    if before is None or _count(now) < _count(before):
        return dict(now)
    return {le: max(0.0, count - before.get(le, 0.0)) for le, count in now.items()}


class LatencyWindow:
    """The buckets' increase over the trailing ``window_s``, from readings (pure: the
    caller passes the time)."""

    def __init__(self, window_s: float = WINDOW_SECONDS) -> None:
        self.window_s = window_s
        self._readings: dict[str, deque[tuple[float, Buckets]]] = {}

    def observe(self, now: float, pods: Mapping[str, PodReading]) -> Buckets:
        """Record this reading of ``pods`` and return their summed increase over the window."""
        cutoff = now - self.window_s
        total: Buckets = {}
        for gone in set(self._readings) - set(pods):
            del self._readings[gone]
        for pod, reading in pods.items():
            history = self._readings.setdefault(pod, deque())
            old = [b for t, b in history if t <= cutoff]
            if old:
                base: Buckets | None = old[-1]
            elif reading.started is not None and reading.started >= cutoff:
                base = None  # started within the window: all of it is in the window
            else:
                base = history[0][1] if history else reading.buckets
            add(total, increase(reading.buckets, base))
            history.append((now, dict(reading.buckets)))
            while len(history) > 1 and history[1][0] <= cutoff:
                history.popleft()  # keep one reading at least a window old
        return total


def measure(total: Mapping[float, float]) -> Measured:
    count = int(_count(total))
    if count < MIN_QUERIES:
        return Measured(None, count)
    p99 = quantile(total, 0.99)
    return Measured(None if p99 is None else round(p99 * 1000.0, 3), count)


def pod_started(pod: Mapping[str, Any]) -> float | None:
    status = pod.get("status") or {}
    meta = pod.get("metadata") or {}
    when = parse_time(status.get("startTime") or meta.get("creationTimestamp"))
    return when.timestamp() if when is not None else None


@dataclass(eq=False, kw_only=True)
class RouterLatency(PodReader):
    """Reads every ready router pod's histogram; ``pod_url`` as for the estimates."""

    window_s: float = WINDOW_SECONDS
    clock: Callable[[], float] = time.time
    _windows: dict[str, LatencyWindow] = field(default_factory=dict, init=False, repr=False)
    # by pipeline, by pod: the last read
    _counts: dict[str, dict[str, EdgeCounts]] = field(default_factory=dict, init=False, repr=False)
    # a pod first read that started before this reader (a restarted operator) gives a base
    # only: what it counted before is in status.edges already
    _began: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._began = self.clock()

    def __call__(self, namespace: str, name: str) -> Measured | None:
        """The end-to-end latency over the trailing window, or None when no pod answered
        (nothing is known: status keeps what it had)."""
        pods = ready_pods(self.kube, namespace, name)
        if not pods:
            return None
        urls = [pod_address(self.pod_url, namespace, pod).rstrip("/") + "/metrics" for pod in pods]
        answers = self.fanout.get(
            f"{namespace}/{name}", urls, deadline=self.deadline, max_bytes=MAX_BYTES
        )
        readings: dict[str, PodReading] = {}
        counts: dict[str, EdgeCounts] = {}
        for pod, answer in zip(pods, answers, strict=True):
            text = answer.body.decode("utf-8", "replace") if answer.ok else None
            buckets = parse_buckets(text, name) if text else None
            if buckets:
                key = str((pod.get("metadata") or {}).get("uid") or pod["metadata"]["name"])
                readings[key] = PodReading(buckets, pod_started(pod))
                found = parse_edge_counts(text, name) if text else None
                if found is not None:
                    counts[key] = found
        if not readings:
            return None
        owner = f"{namespace}/{name}"
        with self._lock:
            window = self._windows.setdefault(owner, LatencyWindow(self.window_s))
            total = window.observe(self.clock(), readings)
            before = self._counts.get(owner, {})
            edges = EdgeCounts()
            for key, found in counts.items():
                started = readings[key].started
                if key not in before and (started is None or started < self._began):
                    continue  # counted before this reader began (status has those): a base
                add_counts(edges, counts_increase(found, before.get(key)))
            self._counts[owner] = counts
        return replace(measure(total), edges=edges)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._windows.pop(f"{namespace}/{name}", None)
            self._counts.pop(f"{namespace}/{name}", None)
