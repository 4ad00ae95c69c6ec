"""Loopback ports for TorchServe: a fixed block per pod, the next free block beside others.

In a pod, TorchServe's ports are fixed and documented (:func:`packrat.serve.config.fixed_ports`:
9080-9084, outside the ephemeral range, so no outgoing connection can take one first);
where several TorchServes share a host (tests, benchmarks), each takes the first block
whose ports are all free.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from packrat.serve.config import DEFAULT_PORT_BASE, LOOPBACK, PORT_BLOCK, Ports, fixed_ports

__all__ = [
    "PORT_BASE_ENV",
    "PORT_BLOCKS_TRIED",
    "TorchServeError",
    "allocate_ports",
    "default_port_base",
    "free_ports",
    "ports_free",
]

PORT_BASE_ENV = "PACKRAT_TORCHSERVE_PORT_BASE"
PORT_BLOCKS_TRIED = 64


class TorchServeError(RuntimeError):
    """TorchServe did not start (no free ports included), or refused a registration."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ports_free(ports: Sequence[int]) -> bool:
    """Whether every port can be bound on loopback right now."""
    socks = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((LOOPBACK, port))
        return True
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()


def default_port_base() -> int:
    raw = os.environ.get(PORT_BASE_ENV)
    if not raw:
        return DEFAULT_PORT_BASE
    try:
        return int(raw)
    except ValueError:
        raise TorchServeError(f"{PORT_BASE_ENV}={raw!r} is not a port number") from None


def allocate_ports(base: int | None = None, *, skip: int = 0) -> Ports:
    """The first block at or above ``base`` (after ``skip`` blocks) whose ports are free."""
    start = default_port_base() if base is None else base
    for k in range(skip, skip + PORT_BLOCKS_TRIED):
        ports = fixed_ports(start + PORT_BLOCK * k)
        if ports_free(ports.listening):
            return ports
    raise TorchServeError(
        f"no free block of TorchServe ports in {start}..{start + PORT_BLOCK * PORT_BLOCKS_TRIED}"
    )
