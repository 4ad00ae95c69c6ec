"""The dispatcher against unfriendly clients: body limits and admission before the body,
bounded buffering, slow heads and bodies, the connection cap, clients that give up, and a
backend that dies. In-process fake TorchServe, real sockets; no torch."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
from dispatcher_support import (
    DEADLINE_S,
    all_up,
    closed,
    head,
    post,
    raw,
    run,
    stack,
    status_of,
    until,
)

from packrat.serve.dispatcher.connections import ConnectionLimits


async def metric(session: aiohttp.ClientSession, url: str, prefix: str) -> float:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def test_an_oversized_body_is_refused_before_it_is_read() -> None:
    async def body() -> None:
        async with stack([1], max_body_bytes=1000, max_buffered_bytes=4000) as (d, fake, url, s):
            all_up(d)
            reader, writer = await raw(url)
            writer.write(head(60 * 1024 * 1024))  # 60 MB announced, nothing sent
            await writer.drain()
            assert await status_of(reader) == 413
            writer.close()
            assert fake.arrived == 0 and d.buffered_bytes == 0
            assert (await post(s, url, b"x" * 1000))[0] == 200

    run(body)


def _socket_buffer_max() -> int:
    """The most bytes the kernel buffers on one loopback connection (send + receive side)."""
    total = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return total


def test_a_refused_body_is_not_read_and_its_connection_is_held_then_closed() -> None:
    """After its 413 a client that keeps sending gets no further than the socket buffers
    (aiohttp alone would read and discard the body for its whole lingering time), and the
    connection is closed once the hold has passed."""
    big = 4 * _socket_buffer_max() + 64 * 1024 * 1024
    limits = ConnectionLimits(refused_hold_s=3.0)

    async def body() -> None:
        async with stack([1], limits=limits, max_body_bytes=1000) as (d, fake, url, s):
            all_up(d)
            reader, writer = await raw(url)
            writer.write(head(big))
            answer = asyncio.ensure_future(status_of(reader))
            chunk = memoryview(bytes(64 * 1024))
            sent = 0
            with contextlib.suppress(ConnectionError):
                while sent < big:
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), DEADLINE_S)
                    sent += len(chunk)
            assert await answer == 413
            assert sent < _socket_buffer_max() + 4 * 1024 * 1024, f"{sent} bytes taken"
            assert await closed(reader)
            writer.close()
            assert fake.arrived == 0 and d.buffered_bytes == 0
            assert (await post(s, url, b"x" * 100))[0] == 200

    run(body)


def test_a_chunked_body_over_the_limit_is_413() -> None:
    async def body() -> None:
        async with stack([1], max_body_bytes=1000, max_buffered_bytes=4000) as (d, fake, url, s):
            all_up(d)

            async def chunks() -> object:
                for _ in range(5):
                    yield b"y" * 400

            async with s.post(f"{url}/predictions/m", data=chunks()) as r:
                assert r.status == 413
            assert fake.arrived == 0 and d.buffered_bytes == 0

    run(body)


def test_admission_comes_before_the_body() -> None:
    """A full queue answers 503 to a client that has sent only its headers."""

    async def body() -> None:
        async with stack([1], queue_limit=0, gate_closed=True) as (_d, fake, url, s):
            held = [asyncio.create_task(post(s, url)) for _ in range(2)]  # cap: 2 in flight
            await until(lambda: fake.arrived == 2, "two in flight")
            reader, writer = await raw(url)
            writer.write(head(500))
            await writer.drain()
            assert await status_of(reader) == 503
            writer.close()
            fake.gate.set()
            assert [r[0] for r in await asyncio.gather(*held)] == [200, 200]

    run(body)


def test_buffered_bytes_are_bounded_across_requests() -> None:
    async def body() -> None:
        async with stack([1], max_body_bytes=1000, max_buffered_bytes=2000) as (d, _f, url, s):
            all_up(d)
            slow = []
            for _ in range(2):  # each reserves its announced 1000 bytes, sends 10
                reader, writer = await raw(url)
                writer.write(head(1000) + b"z" * 10)
                await writer.drain()
                slow.append((reader, writer))
            await until(lambda: d.buffered_bytes == 2000, "two reservations")
            status, data, _, _ = await post(s, url, b"x" * 10)
            assert status == 503 and b"buffered" in data
            for reader, writer in slow:
                writer.write(b"z" * 990)
                await writer.drain()
                assert await status_of(reader) == 200
                writer.close()
            await until(lambda: d.buffered_bytes == 0, "reservations released")
            assert (await post(s, url, b"x" * 10))[0] == 200

    run(body)


def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    async def body() -> None:
        async with stack([1], body_timeout_s=0.5) as (d, fake, url, _s):
            all_up(d)
            reader, writer = await raw(url)
            writer.write(head(100) + b"a" * 10)
            await writer.drain()
            assert await status_of(reader) == 408
            assert await closed(reader)
            writer.close()
            assert fake.arrived == 0 and d.buffered_bytes == 0

    run(body)


def test_slow_heads_are_closed_and_counted() -> None:
    """A connection that trickles its headers used to be held forever."""

    async def body() -> None:
        limits = ConnectionLimits(header_timeout_s=0.5, keepalive_timeout_s=60)
        async with stack([1], limits=limits) as (d, _fake, url, s):
            all_up(d)
            reader, writer = await raw(url)
            writer.write(b"POST /predictions/m HTTP/1.1\r\nHost: x\r\n")  # never finished
            await writer.drain()
            assert await closed(reader)
            writer.close()
            silent_reader, silent = await raw(url)  # sends nothing at all
            assert await closed(silent_reader)
            silent.close()
            assert await metric(s, url, 'packrat_connections_closed_total{reason="header') == 2
            assert (await post(s, url))[0] == 200  # a kept-alive client is unaffected

    run(body)


def test_connections_beyond_the_cap_are_closed() -> None:
    async def body() -> None:
        limits = ConnectionLimits(max_connections=3)
        async with stack([1], limits=limits) as (d, _fake, url, s):
            all_up(d)
            idle = [await raw(url) for _ in range(3)]
            extra_reader, extra = await raw(url)
            assert await closed(extra_reader)
            extra.close()
            for _, writer in idle:
                writer.close()
            await until(lambda: len(d.metrics.connections_closed.collect()) > 0, "a count")
            assert await metric(s, url, 'packrat_connections_closed_total{reason="refused"}') >= 1
            status = 0
            for _ in range(100):  # the closed sockets leave the server's table asynchronously
                status = (await post(s, url))[0]
                if status == 200:
                    break
                await asyncio.sleep(0.05)
            assert status == 200

    run(body)


def test_a_client_that_gives_up_frees_its_slot_before_a_worker_sees_it() -> None:
    """Before: the abandoned request stayed queued, ran, and was counted as a 200."""

    async def body() -> None:
        async with stack([1], queue_limit=4, gate_closed=True) as (d, fake, url, s):
            held = [asyncio.create_task(post(s, url)) for _ in range(2)]
            await until(lambda: fake.arrived == 2, "two in flight")
            _reader, writer = await raw(url)
            writer.write(head(3) + b"abc")
            await writer.drain()
            await until(lambda: d.slots.queued == 1, "one queued")
            writer.close()  # the client gives up
            await until(lambda: d.slots.queued == 0, "the abandoned request dropped")
            cancelled = 'packrat_requests_cancelled_total{model="m",stage="queued"}'
            assert await metric(s, url, cancelled) == 1
            fake.gate.set()
            assert [r[0] for r in await asyncio.gather(*held)] == [200, 200]
            assert (await post(s, url))[0] == 200
            assert fake.arrived == 3  # the abandoned request never reached the backend
            assert await metric(s, url, 'packrat_requests_total{code="200"') == 3

    run(body)


def test_a_client_that_leaves_after_forwarding_keeps_the_slot_until_the_worker_answers() -> None:
    """A forwarded request runs to completion: its worker has it, so its slot stays taken
    until TorchServe answers; it is counted as cancelled in flight, not as a 200."""

    async def body() -> None:
        async with stack([1], queue_limit=4, gate_closed=True) as (d, fake, url, s):
            _reader, writer = await raw(url)
            writer.write(head(3) + b"abc")
            await writer.drain()
            await until(lambda: fake.arrived == 1, "forwarded")
            writer.close()  # the client gives up while the worker has its request
            await writer.wait_closed()
            # a negative check (nothing to wait for): give the server time to see the close
            await asyncio.sleep(0.2)
            assert d.slots.in_flight == 1 and fake.arrived == 1
            fake.gate.set()
            await until(lambda: d.slots.in_flight == 0, "the slot freed once answered")
            cancelled = 'packrat_requests_cancelled_total{model="m",stage="in_flight"}'
            assert await metric(s, url, cancelled) == 1
            assert await metric(s, url, 'packrat_requests_total{code="200"') == 0
            assert (await post(s, url))[0] == 200

    run(body)


def test_when_the_backend_is_gone_queued_clients_get_503_at_once() -> None:
    async def body() -> None:
        async with stack([1], queue_limit=8, gate_closed=True) as (d, fake, url, s):
            tasks = [asyncio.create_task(post(s, url)) for _ in range(5)]
            await until(lambda: d.slots.queued == 3, "three queued")
            d.fail("TorchServe exited")
            queued = [t for t in tasks if not t.done()]
            done, _ = await asyncio.wait(tasks, timeout=DEADLINE_S, return_when="FIRST_COMPLETED")
            assert done
            assert not d.ready
            status, data, _, _ = await post(s, url)
            assert status == 503 and json.loads(data)["code"] == 503
            fake.gate.set()
            statuses = sorted(r[0] for r in await asyncio.gather(*queued))
            assert statuses.count(503) >= 3

    run(body)
