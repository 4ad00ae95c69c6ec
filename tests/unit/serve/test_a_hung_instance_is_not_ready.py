"""Issue 38: an instance whose handler hangs held its requests for 300 s while /ping stayed
200, so the Service kept sending this pod work it could not do. An instance with requests
outstanding and no answer for ``stuck_after_s`` is now *stuck*: it gets no new request; when
every instance is stuck the pod answers /ping 503 (not ready: the Service sends others the
traffic); both end when they answer again. One slow request takes only its own instance out
of the routing (a client cannot take a pod out of its Service with one). Real dispatcher, a
real backend whose answers the test holds."""

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
            first = asyncio.create_task(session.post(f"{front}/predictions/m", data=b"abc"))

            async def one_stuck() -> bool:
                return d.slots.stuck() == [0]

            await _until(one_stuck)
            assert await _ping(session, front) == 200  # the other instance serves
            # new work goes to the other instance, not behind the hung one
            second = asyncio.create_task(session.post(f"{front}/predictions/m", data=b"abc"))

            async def unready() -> bool:
                return await _ping(session, front) == 503

            await _until(unready)  # both hung: the pod leaves the Service
            assert sorted(d.slots.stuck()) == [0, 1] and d.slots.in_flight == 2
            fake.gate.set()  # they answer after all
            for task in (first, second):
                async with await task as r:
                    assert r.status == 200

            async def ready() -> bool:
                return await _ping(session, front) == 200

            await _until(ready)
            assert d.slots.stuck() == []

    run(main)
