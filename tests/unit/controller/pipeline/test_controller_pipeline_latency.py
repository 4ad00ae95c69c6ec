"""The measured end-to-end P99 from the router pods' histograms: parsing, the quantile, the
trailing window, the reader against real router metrics served over HTTP, and its place in
the pipeline's status."""

from __future__ import annotations

import http.server
import math
import threading
from collections.abc import Iterator

import pytest
import yaml
from kube_support import NS, FakeKube
from pipeline_support import NAME, Cluster, pipeline_body
from prometheus_client import generate_latest

from packrat.controller.pipeline.latency import (
    MIN_QUERIES,
    WINDOW_SECONDS,
    EdgeCounts,
    LatencyWindow,
    Measured,
    PodReading,
    RouterLatency,
    counts_increase,
    increase,
    measure,
    parse_buckets,
    parse_edge_counts,
    quantile,
)
from packrat.controller.pipeline.manifests import CONFIG_KEY, router_name
from packrat.serve.router import RouterMetrics


def _metrics(pipeline: str, seconds: list[float], *, taken: int = 0) -> str:
    """A router's metrics: ``seconds`` answered, each by stage a; ``taken`` went on to b."""
    m = RouterMetrics()
    for s in seconds:
        m.duration.labels(pipeline).observe(s)
        m.stage_answers.labels(pipeline, "a").inc()
    if taken:
        m.edges_taken.labels(pipeline, "a", "b").inc(taken)
    m.edges_taken.labels("other", "a", "b").inc(1000)
    m.duration.labels("other").observe(100.0)  # another pipeline's series is not ours
    return generate_latest(m.registry).decode()


def test_quantile_interpolates_within_the_bucket() -> None:
    # 100 queries: 50 in (0, 0.01], 49 in (0.01, 0.025], 1 in (0.025, 0.05]
    buckets = {0.01: 50.0, 0.025: 99.0, 0.05: 100.0, math.inf: 100.0}
    assert quantile(buckets, 0.5) == pytest.approx(0.01)
    assert quantile(buckets, 0.99) == pytest.approx(0.025)
    assert quantile(buckets, 0.995) == pytest.approx(0.0375)
    assert quantile({0.01: 0.0, math.inf: 5.0}, 0.99) == 0.01  # past the last bound
    assert quantile({0.01: 0.0, math.inf: 0.0}, 0.99) is None
    assert quantile({0.01: 3.0}, 0.99) is None  # no +Inf bucket: not a histogram


def test_parse_buckets_of_the_router_metrics() -> None:
    text = _metrics(NAME, [0.004] * 99 + [0.3])
    buckets = parse_buckets(text, NAME)
    assert buckets is not None and buckets[math.inf] == 100
    assert quantile(buckets, 0.99) == pytest.approx(0.005)
    assert parse_buckets(text, "absent") is None
    assert parse_buckets("not { prometheus", NAME) is None


@pytest.fixture
def routers() -> Iterator[list[str]]:
    """Two router pods' /metrics on a local server (path /<pod>/metrics)."""
    texts = {
        "r1": _metrics(NAME, [0.004] * 60, taken=10),
        "r2": _metrics(NAME, [0.004] * 39 + [0.3], taken=5),
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pod = self.path.strip("/").split("/")[0]
            body = texts.get(pod, "").encode()
            self.send_response(200 if pod in texts else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield [f"http://127.0.0.1:{server.server_port}", *texts]
    finally:
        server.shutdown()


NOW = 1_800_000_000.0  # the reader's clock in these tests
STARTED = "2027-01-15T08:00:00Z"  # = NOW - 0 s: the pods started within the window


def _pod(name: str, *, ready: bool = True) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"app": "router"}},
        "status": {
            "startTime": STARTED,
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_reader_adds_every_ready_router_pod(routers: list[str], kube: FakeKube) -> None:
    url, *pods = routers
    kube.create(
        "services", NS, {"metadata": {"name": NAME}, "spec": {"selector": {"app": "router"}}}
    )
    for pod in pods:
        kube.create("pods", NS, _pod(pod))
    reader = RouterLatency(kube, pod_url=url + "/{pod}", clock=lambda: NOW)
    # 100 queries in all, one slow: P99 at the top of the 0.0025..0.005 s bucket (both
    # pods started within the window: all they answered counts)
    first = reader(NS, NAME)
    assert first == Measured(pytest.approx(5.0), 100, first.edges)  # type: ignore[arg-type, union-attr]
    # the edge counters, summed over the pods (the first reading: all of them)
    assert first is not None and first.edges == EdgeCounts({("a", "b"): 15.0}, {"a": 100.0})
    kube.delete("pods", NS, "r2")
    kube.create("pods", NS, _pod("r2", ready=False))  # a pod not ready is not read
    measured = reader(NS, NAME)
    assert measured is not None and measured.queries == 60
    assert measured.edges == EdgeCounts({("a", "b"): 0.0}, {"a": 0.0})  # r1: no increase
    # a reader started after the pods (a restarted operator): their counts are a base only
    later = RouterLatency(kube, pod_url=url + "/{pod}", clock=lambda: NOW + 60)
    first = later(NS, NAME)
    assert first is not None and first.edges == EdgeCounts()
    assert measured.p99_ms == pytest.approx(2.5 + 2.5 * (0.99 * 60) / 60, abs=0.001)
    kube.delete("pods", NS, "r1")
    assert reader(NS, NAME) is None  # nothing to read
    assert MIN_QUERIES <= 60  # (r1 alone is enough queries)


def _buckets(fast: float, slow: float = 0.0) -> dict[float, float]:
    """Cumulative buckets: ``fast`` queries at <= 10 ms, ``slow`` more at <= 1 s."""
    return {0.01: fast, 1.0: fast + slow, math.inf: fast + slow}


def test_increase_is_per_bucket_and_all_after_a_reset() -> None:
    assert increase(_buckets(30, 2), _buckets(10, 1)) == _buckets(20, 1)
    assert increase(_buckets(5), _buckets(10, 1)) == _buckets(5)  # counts went down: restarted
    assert increase(_buckets(5), None) == _buckets(5)


def test_window_counts_only_the_trailing_window() -> None:
    w = LatencyWindow(window_s=300)
    old = NOW - 3600  # a router pod started an hour before the operator first reads it
    # first reading: what it answered before is of unknown age, so nothing counts yet
    assert w.observe(NOW, {"r1": PodReading(_buckets(1000, 50), old)})[math.inf] == 0
    # 30 s later: the 40 queries since the first reading (the window is that long so far)
    assert w.observe(NOW + 30, {"r1": PodReading(_buckets(1040, 50), old)}) == _buckets(40)
    assert w.observe(NOW + 200, {"r1": PodReading(_buckets(1100, 55), old)}) == _buckets(100, 5)
    # 400 s: against the newest reading at least 300 s old (at 30 s): 80 fast, 5 slow
    assert w.observe(NOW + 400, {"r1": PodReading(_buckets(1120, 55), old)}) == _buckets(80, 5)
    # 600 s: against the reading at 200 s; the slow ones of before 200 s are out
    assert w.observe(NOW + 600, {"r1": PodReading(_buckets(1130, 55), old)}) == _buckets(30)
    # a second pod started within the window counts from zero; r1 restarted: from zero too
    both = {
        "r1": PodReading(_buckets(3), old),
        "r2": PodReading(_buckets(7, 1), NOW + 500),
    }
    assert w.observe(NOW + 630, both) == _buckets(10, 1)
    # a pod gone is forgotten; r2, started within the window, still counts all it answered
    assert w.observe(NOW + 660, {"r2": PodReading(_buckets(9, 1), NOW + 500)}) == _buckets(9, 1)
    assert WINDOW_SECONDS == 300


def test_measure_needs_enough_queries_in_the_window() -> None:
    assert measure(_buckets(MIN_QUERIES - 1)) == Measured(None, MIN_QUERIES - 1)
    found = measure({0.005: 99.0, 0.01: 100.0, math.inf: 100.0})
    assert found == Measured(5.0, 100)


def test_measured_p99_in_status_decides_slo_met(cluster: Cluster) -> None:
    c = cluster
    assert c.settle()["phase"] == "Serving"
    assert "measuredP99Ms" not in c.status() and c.status()["sloMet"] is True
    c.pipelines.reconcile(NS, NAME, now=c.now, measured=Measured(250.0, 100))  # SLO 200 ms
    status = c.status()
    assert status["measuredP99Ms"] == 250.0 and status["sloMet"] is False
    assert status["measuredQueries"] == 100
    c.pipelines.reconcile(NS, NAME, now=c.now)  # no reading this pass: the last one stays
    assert c.status()["measuredP99Ms"] == 250.0 and c.status()["sloMet"] is False
    c.pipelines.reconcile(NS, NAME, now=c.now, measured=Measured(20.0, 100))
    assert c.status()["sloMet"] is True
    # too few queries in the window: no measured P99 (the simulated one decides again)
    c.pipelines.reconcile(NS, NAME, now=c.now, measured=Measured(250.0, 100))
    c.pipelines.reconcile(NS, NAME, now=c.now, measured=Measured(None, 3))
    status = c.status()
    assert "measuredP99Ms" not in status and status["measuredQueries"] == 3
    assert status["sloMet"] is True


def test_edge_counts_are_validated_and_restart_on_a_reset() -> None:
    text = _metrics(NAME, [0.004] * 30, taken=12)
    assert parse_edge_counts(text, NAME) == EdgeCounts({("a", "b"): 12.0}, {"a": 30.0})
    assert parse_edge_counts(text, "absent") == EdgeCounts()
    series = f'packrat_pipeline_edges_taken_total{{dst="b",pipeline="{NAME}",src="a"}}'
    bad = text.replace(f"{series} 12.0", f"{series} -3")
    assert bad != text and parse_edge_counts(bad, NAME) is None
    assert parse_edge_counts("not { prometheus", NAME) is None
    before = EdgeCounts({("a", "b"): 10.0}, {"a": 40.0})
    later = EdgeCounts({("a", "b"): 15.0}, {"a": 60.0})
    assert counts_increase(later, before) == EdgeCounts({("a", "b"): 5.0}, {"a": 20.0})
    restarted = EdgeCounts({("a", "b"): 2.0}, {"a": 9.0})
    assert counts_increase(restarted, before) == restarted


def test_measured_fractions_replace_the_declared_ones_after_enough_samples() -> None:
    c = Cluster(pipeline_body(edges=[{"from": "first", "to": "second", "fraction": 0.5}]))
    assert c.settle()["phase"] == "Serving"
    planned = c.status()["planSignature"]
    assert c.status()["edges"] == [{"from": "first", "to": "second", "declared": 0.5}]

    def read(taken: float, answered: float) -> dict[str, object]:
        counts = EdgeCounts({("first", "second"): taken}, {"first": answered})
        c.pipelines.reconcile(NS, NAME, now=c.now, measured=Measured(20.0, 100, counts))
        return c.status()

    status = read(30, 100)  # 100 answers: not enough to plan on
    (edge,) = status["edges"]  # type: ignore[misc]
    assert (edge["measured"], edge["samples"], "used" in edge) == (0.3, 100, False)
    assert status["planSignature"] == planned
    status = read(30, 100)  # 200: the planner takes the measured fraction
    (edge,) = status["edges"]  # type: ignore[misc]
    assert edge["used"] == pytest.approx(0.3) and edge["declared"] == 0.5
    assert status["planSignature"] != planned
    second = {s["name"]: s for s in status["stages"]}["second"]  # type: ignore[attr-defined]
    assert second["scaleFactor"] == pytest.approx(0.3, abs=0.05)  # simulated on 0.3
    replanned = status["planSignature"]
    for taken in (33, 27, 32):  # noise: no new plan
        assert read(taken, 100)["planSignature"] == replanned
    before = c.status()["edges"]
    assert read(-5, 100)["edges"] == before  # junk counts: no evidence
    assert read(150, 100)["edges"] == before  # more took the edge than reached its source
    # the router keeps drawing the declared fraction
    router = c.obj("configmaps", router_name(NAME))
    (edge_config,) = yaml.safe_load(router["data"][CONFIG_KEY])["edges"]
    assert edge_config["fraction"] == 0.5
