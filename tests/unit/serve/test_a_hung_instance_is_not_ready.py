"""Issue 38: an instance whose handler hangs held its requests for 300 s while /ping stayed
200, so the Service kept sending this pod work it could not do. An instance with requests
outstanding and no answer for ``stuck_after_s`` is now *stuck*: it gets no new request, the
pod answers /ping 503 (not ready: the Service sends others the traffic), and both end when it
answers again. Real dispatcher, a real backend whose answers the test holds."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher_support import run, stack


async def _ping(session: Any, front: str) -> int:
    async with session.get(f"{front}/ping") as r:
        return int(r.status)


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(30):
        while not await predicate():
            await asyncio.sleep(0.02)


def test_a_hung_instance_makes_the_pod_unready_until_it_answers() -> None:
    async def main() -> None:
        async with stack([1, 1], stuck_after_s=0.3) as (d, fake, front, session):
            d.set_up(0, True)
            d.set_up(1, True)
            assert await _ping(session, front) == 200
            fake.gate.clear()  # the handler hangs
            hung = asyncio.create_task(session.post(f"{front}/predictions/m", data=b"abc"))

            async def unready() -> bool:
                return await _ping(session, front) == 503

            await _until(unready)
            assert d.slots.in_flight == 1
            # new work goes to the other instance, not behind the hung one
            assert d.slots.stuck() == [0] or d.slots.stuck() == [1]
            fake.gate.set()  # it answers after all
            async with await hung as r:
                assert r.status == 200

            async def ready() -> bool:
                return await _ping(session, front) == 200

            await _until(ready)
            assert d.slots.stuck() == []

    run(main)
