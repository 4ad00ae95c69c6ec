"""The harness restarts the operator on fresh ports (issue 38): on a busy machine another
process took the metrics port in the 2 s between stop and start, and the restarted operator
died with ``Address already in use``. Here a port is taken on purpose: the operator is given
a port another socket holds, loses the race, and is started again on fresh ports."""

from __future__ import annotations

import socket

import harness
import pytest
from harness import OperatorCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_restart_gets_fresh_ports(cluster: OperatorCluster) -> None:
    op = cluster.operator
    before = (op.metrics_port, op.liveness_port)
    op.stop()
    op.start()
    op.wait_healthy()
    assert (op.metrics_port, op.liveness_port) != before
    assert "packrat_operator" in op.metrics()


def test_a_port_taken_before_the_operator_binds_it(
    cluster: OperatorCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = cluster.operator
    starts = op.starts
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        fresh = harness.free_port
        # the first pick is the squatter's port (as if taken between pick and bind)
        monkeypatch.setattr(harness, "free_port", lambda: next(picks, None) or fresh())
        op.stop()
        op.start()
        op.wait_healthy()
    assert op.starts == starts + 2  # the lost race, then a fresh start
    assert op.metrics_port != taken
    assert "packrat_operator" in op.metrics()
