"""The measured end-to-end P99 from the router pods' histograms: parsing, the quantile, the
reader against real router metrics served over HTTP, and its place in the pipeline's status."""

from __future__ import annotations

import http.server
import math
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from test_controller_pipeline import NAME, Cluster
from test_controller_reconcile import NS, FakeKube

from packrat.controller.pipeline_latency import (
    MIN_QUERIES,
    RouterLatency,
    parse_buckets,
    quantile,
)
from packrat.serve.router import RouterMetrics


def _metrics(pipeline: str, seconds: list[float]) -> str:
    m = RouterMetrics()
    for s in seconds:
        m.duration.labels(pipeline).observe(s)
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
        "r1": _metrics(NAME, [0.004] * 60),
        "r2": _metrics(NAME, [0.004] * 39 + [0.3]),
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


def _pod(name: str, *, ready: bool = True) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"app": "router"}},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_reader_adds_every_ready_router_pod(routers: list[str]) -> None:
    url, *pods = routers
    kube = FakeKube()
    kube.create(
        "services", NS, {"metadata": {"name": NAME}, "spec": {"selector": {"app": "router"}}}
    )
    for pod in pods:
        kube.create("pods", NS, _pod(pod))
    reader = RouterLatency(kube, pod_url=url + "/{pod}")
    try:
        # 100 queries in all, one slow: P99 at the top of the 0.0025..0.005 s bucket
        assert reader(NS, NAME) == pytest.approx(5.0)
        kube.delete("pods", NS, "r2")
        kube.create("pods", NS, _pod("r2", ready=False))  # a pod not ready is not read
        assert reader(NS, NAME) == pytest.approx(2.5 + 2.5 * (0.99 * 60) / 60, abs=0.001)
        kube.delete("pods", NS, "r1")
        assert reader(NS, NAME) is None  # nothing to read
    finally:
        reader.close()
    assert MIN_QUERIES <= 60  # (r1 alone is enough queries)


def test_measured_p99_in_status_decides_slo_met() -> None:
    c = Cluster()
    assert c.settle()["phase"] == "Serving"
    assert "measuredP99Ms" not in c.status() and c.status()["sloMet"] is True
    c.pipelines.reconcile(NS, NAME, now=c.now, measured_p99_ms=250.0)  # SLO 200 ms
    status = c.status()
    assert status["measuredP99Ms"] == 250.0 and status["sloMet"] is False
    c.pipelines.reconcile(NS, NAME, now=c.now)  # no reading this pass: the last one stays
    assert c.status()["measuredP99Ms"] == 250.0 and c.status()["sloMet"] is False
    c.pipelines.reconcile(NS, NAME, now=c.now, measured_p99_ms=20.0)
    assert c.status()["sloMet"] is True
