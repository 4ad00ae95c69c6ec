"""How long a PackratPool's reconcile pass waits on pool pods that never answer.

Starts ``--pods`` loopback listeners that accept a connection and never answer (a
blackholed pool pod), then times the operator's own pool reader
(:class:`packrat.controller.pool.readings.PoolReader`, through the operator's pod client)
reading all of them once, ``--rounds`` times. Run it once per source tree (``PYTHONPATH``
picks the tree) to compare a reader against another: interleave the runs (A B A B).

    PYTHONPATH=<tree>/operator flock /tmp/packrat-bench.lock \\
        python benchmarks/pools/blackholed_reads.py --pods 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

from packrat.controller.core.fanout import PodFanout
from packrat.controller.pool import manifests as pm
from packrat.controller.pool.readings import PoolReader

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a pool\'s pass wait on pool pods that never answer?"'
    " (#how-long-does-a-pools-pass-wait-on-pool-pods-that-never-answer)"
)


class _Pods:
    """The API server's pod list for one pool: pod ``p-<i>`` ready at the i-th listener
    (its port stands in for its IP: the reader's URL template is ``http://127.0.0.1:{ip}``)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    def list(
        self, resource: str, namespace: str, *, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {"name": f"p-{i}-x", "labels": pm.pod_labels("p", f"p-{i}")},
                "status": {
                    "phase": "Running",
                    "podIP": str(port),
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
            for i, port in enumerate(self.ports)
        ]


def _blackholes(n: int) -> list[socket.socket]:
    """``n`` listeners whose connections are accepted by the kernel and never answered."""
    out = []
    for _ in range(n):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)  # never accept(): the backlog takes the connection, nothing answers
        out.append(sock)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--pods", type=int, default=8, help="blackholed pool pods")
    parser.add_argument("--rounds", type=int, default=3, help="timed reads")
    args = parser.parse_args()
    socks = _blackholes(args.pods)
    fanout = PodFanout()
    kube = _Pods([s.getsockname()[1] for s in socks])
    reader = PoolReader(kube, pod_url="http://127.0.0.1:{ip}", fanout=fanout)  # type: ignore[arg-type]
    expected = {f"p-{i}": {"a"} for i in range(args.pods)}
    times = []
    try:
        for _ in range(args.rounds):
            start = time.perf_counter()
            got = reader("ns", "p", expected, token="t")
            times.append(time.perf_counter() - start)
            assert all(not hosted for hosted in got.values())
    finally:
        fanout.close()
        for sock in socks:
            sock.close()
    print(json.dumps({"pods": args.pods, "seconds": [round(t, 3) for t in times],
                      "median_s": round(statistics.median(times), 3),
                      "threads": threading.active_count()}))  # fmt: skip


if __name__ == "__main__":
    main()
