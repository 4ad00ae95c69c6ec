"""Fault 8: serving pods whose ``/status`` is hostile (huge, stalled, redirecting), read by the
operator's estimate reader through the real Kubernetes client against the emulator.

The reader must take a bounded amount from each pod, never wait on a stalled one past its
deadline (checked by order, not time: the stalled pod is released only after the reader
returned), never follow a redirect, and still use the pods that answer properly.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from emulator import Api, EmulatorThread

from packrat.controller.api.kube import Kube
from packrat.controller.planning.autobatch import Reading
from packrat.controller.planning.estimates import MAX_BYTES, EstimateReader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NAMESPACE = "est"
HUGE = 64 * 1024 * 1024


class Pods:
    """Four serving pods on loopback: good, huge, stalled, redirecting (and its target)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.huge_sent = 0
        self.redirect_hits = 0
        self.servers: dict[str, http.server.ThreadingHTTPServer] = {}
        pods = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                kind = self.server.kind  # type: ignore[attr-defined]
                if kind == "good":
                    body = json.dumps({"batch_size_estimate": {"estimate": 4}}).encode()
                    self._send(body)
                elif kind == "huge":
                    self.send_response(200)
                    self.send_header("Content-Length", str(HUGE))
                    self.end_headers()
                    chunk = b" " * 65536
                    try:
                        while pods.huge_sent < HUGE:
                            self.wfile.write(chunk)
                            pods.huge_sent += len(chunk)
                    except OSError:
                        pass
                elif kind == "stalled":
                    pods.release.wait(90)
                    self._send(b'{"batch_size_estimate": {"estimate": 16}}')
                elif kind == "redirect":
                    target = pods.servers["target"].server_address[1]
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{target}/status")
                    self.end_headers()
                else:  # where the redirect points
                    pods.redirect_hits += 1
                    self._send(b'{"batch_size_estimate": {"estimate": 32}}')

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        for kind in ("good", "huge", "stalled", "redirect", "target"):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.kind = kind  # type: ignore[attr-defined]
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers[kind] = server

    def port(self, kind: str) -> int:
        return int(self.servers[kind].server_address[1])

    def close(self) -> None:
        self.release.set()
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Api, Kube, Pods]]:
    import kubernetes

    emulator = EmulatorThread().start()
    pods = Pods()
    try:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        yield Api(emulator.url, NAMESPACE), Kube(client), pods
    finally:
        pods.close()
        emulator.stop()


def test_fault8_hostile_pod_status_is_bounded(setup: tuple[Api, Kube, Pods]) -> None:
    api, kube, pods = setup
    selector = {"app.kubernetes.io/instance": "m", "packrat.dev/slot": "a"}
    api.create(
        "services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "m"},
            "spec": {"selector": selector},
        },
    )
    for kind in ("good", "huge", "stalled", "redirect"):
        api.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                # the pod's name carries its port: pod_url below is http://{ip}:{pod}
                "metadata": {"name": str(pods.port(kind)), "labels": selector},
                "spec": {"containers": [{"name": "serve", "image": "x"}]},
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )
    reader = EstimateReader(
        kube, pod_url="http://{ip}:{pod}", service_url="http://127.0.0.1:1/{service}"
    )
    reading = reader(NAMESPACE, "m")
    stalled_still_waiting = not pods.release.is_set()
    assert stalled_still_waiting  # the reader did not wait for the stalled pod
    assert reading == Reading((4,), "pods")  # only the well-behaved pod counts
    assert pods.redirect_hits == 0  # the redirect was not followed
    # the huge answer was cut short: at most what the socket buffers took before the close
    assert pods.huge_sent < HUGE // 4, pods.huge_sent
    # a cap that holds a 256-instance pod's /status (issue 38), far below the huge answer
    assert MAX_BYTES <= 128 * 1024
