"""Issue 38: health probes that hostile clients cannot starve. Nine client addresses holding
every ordinary connection and every probe-only place (connections that never send a head)
made the kubelet's /ping fail; a probe-only connection still waiting for its head now gives
its place to a newer one, so a real probe (its head arrives at once) always gets through.
Real dispatcher, real sockets from nine loopback source addresses."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher_support import run, stack

from packrat.serve.dispatcher.connections import ConnectionLimits

LIMITS = ConnectionLimits(
    max_connections=8,
    max_per_client=2,
    probe_reserve=4,
    probe_reserve_per_client=2,
    probe_head_timeout_s=30.0,  # the attackers' connections outlive the test
    header_timeout_s=30.0,
)


def _closed(d: Any, reason: str) -> float:
    value = d.metrics.registry.get_sample_value(
        "packrat_connections_closed_total", {"reason": reason}
    )
    return value or 0.0


async def _ping(host: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.1", 0))
    writer.write(b"GET /ping HTTP/1.1\r\nHost: pod\r\n\r\n")
    await writer.drain()
    try:
        return await reader.readline()
    finally:
        writer.close()


def test_nine_hostile_addresses_cannot_starve_the_probes() -> None:
    async def main() -> None:
        async with stack([1], limits=LIMITS) as (d, _, front, _session):
            d.set_up(0, True)
            host, port = front.removeprefix("http://").split(":")
            held = []
            for i in range(2, 11):  # 9 addresses, each past its ordinary and probe shares
                for _ in range(5):
                    held.append(
                        await asyncio.open_connection(
                            host, int(port), local_addr=(f"127.0.0.{i}", 0)
                        )
                    )
            # every place taken: 8 ordinary + 4 probe-only, the other 33 refused
            async with asyncio.timeout(30):
                while _closed(d, "refused") < 45 - 12:
                    await asyncio.sleep(0.01)
            try:
                for _ in range(5):  # the kubelet probing, again and again
                    assert (await _ping(host, int(port))).startswith(b"HTTP/1.1 200")
            finally:
                for _, writer in held:
                    writer.close()

    run(main)
