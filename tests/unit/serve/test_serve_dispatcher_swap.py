"""Dispatcher.swap: new requests go to the new set at once; the old set's requests finish."""

from __future__ import annotations

import asyncio

from dispatcher_support import held, run, stack

from packrat.serve.config import InstanceSpec


def _new(batches: list[int]) -> list[InstanceSpec]:
    return [
        InstanceSpec(index=i, name=f"m_g1_i{i}", threads=1, batch=b, cpus=(i,))
        for i, b in enumerate(batches)
    ]


def test_swap_moves_new_requests_while_old_ones_finish_on_the_old_set() -> None:
    async def go() -> None:
        async with stack([1, 1], queue_limit=16, gate_closed=True) as (
            dispatcher,
            fake,
            url,
            session,
        ):
            # every answer held

            async def one(i: int) -> tuple[int, bytes]:
                async with session.post(f"{url}/predictions/m", data=f"r{i}".encode()) as r:
                    return r.status, await r.read()

            # 4 in flight (two per b=1 instance) and 2 more queued on the old set.
            old_batch = [asyncio.ensure_future(one(i)) for i in range(6)]
            while dispatcher.pending < 6:
                await asyncio.sleep(0.01)
            assert dispatcher.slots.queued == 2
            old = dispatcher.swap(_new([4]))
            assert dispatcher.ready and dispatcher.pending == 6
            new_batch = [asyncio.ensure_future(one(i)) for i in range(6, 10)]
            while fake.calls["m_g1_i0"] < 4:
                await asyncio.sleep(0.01)
            retired = asyncio.ensure_future(
                dispatcher.retire(old, [], timeout_s=60.0)  # waits for the old set
            )
            await asyncio.sleep(0.05)
            assert not retired.done()
            fake.gate.set()
            results = await asyncio.gather(*old_batch, *new_batch)
            assert await retired is True
            assert [s for s, _ in results] == [200] * 10
            assert [b for _, b in results] == [f"r{i}".encode()[::-1] for i in range(10)]
            # Every old request was served by an old instance, every new one by the new one.
            assert fake.calls["m_i0"] + fake.calls["m_i1"] == 6
            assert fake.calls["m_g1_i0"] == 4
            assert dispatcher.pending == 0 and old.pending == 0

    run(go)


def test_wait_idle_covers_a_retiring_set() -> None:
    async def go() -> None:
        async with stack([1], queue_limit=4, gate_closed=True) as (dispatcher, fake, url, session):
            (request,) = await held(dispatcher, session, url, 1)
            dispatcher.swap(_new([1]))
            assert await dispatcher.wait_idle(0.1) is False  # the old set still has one
            fake.gate.set()
            assert await request == 200
            assert await dispatcher.wait_idle(60.0) is True

    run(go)


def test_fail_answers_the_retiring_set_too() -> None:
    async def go() -> None:
        async with stack([1], queue_limit=8, gate_closed=True) as (dispatcher, fake, url, session):
            reqs = await held(dispatcher, session, url, 4)  # 2 in flight, 2 queued
            old = dispatcher.swap(_new([1]))
            dispatcher.fail("gone")
            assert old.queued == 0  # its waiters were answered at once
            fake.gate.set()
            statuses = sorted(await asyncio.gather(*reqs))
            assert statuses == [200, 200, 503, 503]

    run(go)
