"""TorchServe's ports: fixed, documented, outside the ephemeral range, next block when taken.

Before, ports were picked by binding ephemeral ports, releasing them and handing the numbers
to TorchServe later, so any outgoing connection could take one in between (a benchmark died
on "Address already in use" for its gRPC port)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.serve.config import DEFAULT_PORT_BASE, LOOPBACK, ServeConfigError, fixed_ports
from packrat.serve.torchserve import process as torchserve
from packrat.serve.torchserve.process import PORT_BASE_ENV, TorchServe, allocate_ports, ports_free

EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_the_pod_ports_are_fixed_and_documented() -> None:
    ports = fixed_ports()
    assert ports.listening == (9080, 9081, 9082, 9083, 9084)
    assert DEFAULT_PORT_BASE == 9080
    assert max(ports.listening) < EPHEMERAL_LOW
    readme = (ROOT / "docs" / "serving.md").read_text()
    assert "9080" in readme and "9084" in readme


def test_a_port_base_outside_the_safe_range_is_refused() -> None:
    with pytest.raises(ServeConfigError):
        fixed_ports(80)
    with pytest.raises(ServeConfigError):
        fixed_ports(40000)


@pytest.fixture
def hold() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def _bind(held: list[socket.socket], port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, port))
    sock.listen()
    held.append(sock)


def test_a_taken_block_moves_to_the_next(hold: list[socket.socket]) -> None:
    base = 21000
    first = allocate_ports(base)
    assert ports_free(first.listening)
    _bind(hold, first.grpc_management)  # the last port of the block
    second = allocate_ports(base)
    assert second.inference == first.inference + 10
    assert ports_free(second.listening)


def test_the_base_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_BASE_ENV, "22000")
    assert allocate_ports().inference >= 22000
    monkeypatch.setenv(PORT_BASE_ENV, "x")
    with pytest.raises(torchserve.TorchServeError):
        allocate_ports()


def test_a_start_that_lost_its_ports_retries_on_the_next_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race itself: the ports were free when chosen, taken when TorchServe bound them."""
    import asyncio

    ts = TorchServe(workdir=tmp_path, port_base=23000)
    tried: list[int] = []

    async def fake_start_once(*, timeout_s: float) -> None:
        tried.append(ts.ports.inference)
        if len(tried) == 1:
            raise torchserve.TorchServeError("TorchServe could not bind: Address already in use")

    monkeypatch.setattr(ts, "_start_once", fake_start_once)
    asyncio.run(ts.start())
    assert tried[0] >= 23000 and tried[1] > tried[0]
