"""The dispatcher against an in-process fake TorchServe: routing, pass-through, shedding,
readiness, metrics and draining. No processes, no torch."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from dispatcher_support import all_up, post, run, stack


def test_bodies_content_types_and_statuses_pass_through() -> None:
    async def body() -> None:
        async with stack([2]) as (d, _fake, url, s):
            all_up(d)
            status, data, ctype, _ = await post(s, url, b"hello", **{"Content-Type": "text/plain"})
            assert (status, data, ctype) == (200, b"olleh", "text/plain")
            status, data, _, _ = await post(s, url, b"bad", **{"X-Status": "400"})
            assert (status, data) == (400, b"dab")
            status, _, _, _ = await post(s, url, **{"X-Status": "507"})
            assert status == 507

    run(body)


def test_unknown_model_is_404() -> None:
    async def body() -> None:
        async with stack([1]) as (d, _fake, url, s):
            all_up(d)
            async with s.post(f"{url}/predictions/other", data=b"x") as r:
                assert r.status == 404
                assert json.loads(await r.text())["code"] == 404

    run(body)


def test_a_burst_is_split_by_batch_size() -> None:
    async def body() -> None:
        async with stack([4, 2], gate_closed=True) as (_d, fake, url, s):
            tasks = [asyncio.create_task(post(s, url)) for _ in range(6)]
            while fake.arrived < 6:
                await asyncio.sleep(0.01)
            assert fake.calls == Counter({"m_i0": 4, "m_i1": 2})
            fake.gate.set()
            assert all(r[0] == 200 for r in await asyncio.gather(*tasks))

    run(body)


def test_the_shed_series_exist_at_zero_before_the_first_request() -> None:
    # rate() over a counter first scraped after a burst of 503s sees no increase
    async def body() -> None:
        async with stack([1]) as (_d, _fake, url, s):
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            for series in (
                'packrat_request_errors_total{code="503",model="m",source="dispatcher"} 0.0',
                'packrat_requests_total{code="503",model="m"} 0.0',
                'packrat_requests_total{code="200",model="m"} 0.0',
            ):
                assert series in text

    run(body)


def test_full_queue_sheds_with_503_and_retry_after() -> None:
    async def body() -> None:
        async with stack([1], queue_limit=1, gate_closed=True) as (d, fake, url, s):
            # cap = 2 in flight for b=1, then 1 queued, then shed
            held = [asyncio.create_task(post(s, url)) for _ in range(3)]
            while fake.arrived < 2 or d.pending < 3:
                await asyncio.sleep(0.01)
            status, _, _, headers = await post(s, url)
            assert status == 503
            assert headers["Retry-After"] == "1"
            fake.gate.set()
            assert [r[0] for r in await asyncio.gather(*held)] == [200, 200, 200]
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            assert (
                'packrat_request_errors_total{code="503",model="m",source="dispatcher"} 1.0' in text
            )

    run(body)


def test_ping_follows_instances_and_drain() -> None:
    async def body() -> None:
        async with stack([1, 1]) as (d, _fake, url, s):

            async def ping() -> int:
                async with s.get(f"{url}/ping") as r:
                    return r.status

            assert await ping() == 503
            d.set_up(0, True)
            assert await ping() == 503
            d.set_up(1, True)
            assert await ping() == 200
            d.set_up(1, False)
            assert await ping() == 503
            d.set_up(1, True)
            d.begin_drain()
            assert await ping() == 503
            async with s.get(f"{url}/healthz") as r:
                assert r.status == 200  # draining is not dead

    run(body)


def test_requests_wait_for_a_down_instance_then_time_out() -> None:
    async def body() -> None:
        async with stack([1], queue_timeout_s=0.2) as (d, _fake, url, s):
            status, _, _, _ = await post(s, url)
            assert status == 503
            assert d.pending == 0
            task = asyncio.create_task(post(s, url))
            await asyncio.sleep(0.05)
            d.set_up(0, True)  # the queued request goes as soon as the instance is up
            assert (await task)[0] == 200

    run(body)


def test_estimate_follows_outstanding_requests() -> None:
    async def body() -> None:
        async with stack([8], estimator_interval_s=0.001, estimator_window=20) as (
            d,
            fake,
            url,
            s,
        ):
            all_up(d)
            fake.gate.clear()
            tasks = [asyncio.create_task(post(s, url)) for _ in range(9)]
            while d.pending < 9:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            assert d.estimator.estimate == 8  # EWMA -> 9, floored to a power of two
            async with s.get(f"{url}/metrics") as r:
                assert 'packrat_batch_size_estimate{model="m"} 8.0' in await r.text()
            async with s.get(f"{url}/status") as r:
                doc = await r.json()
            assert doc["batch_size_estimate"]["estimate"] == 8
            assert doc["batch_size_estimate"]["stable_seconds"] >= 0
            assert doc["batch_size_estimate"]["batches"] == {"full": 0, "timeout": 0}
            d.record_batch("m_i0", full=True)
            d.record_batch("m_i0", full=False)
            d.record_batch("m_i0", full=False)
            async with s.get(f"{url}/status") as r:
                counts = (await r.json())["batch_size_estimate"]["batches"]
            assert counts == {"full": 1, "timeout": 2}
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            series = 'packrat_batches_total{model="m",plan_instance="m_i0",reason="timeout"}'
            assert f"{series} 2.0" in text
            assert doc["outstanding"]["in_flight"] == 9
            fake.gate.set()
            await asyncio.gather(*tasks)
            assert await d.wait_idle(2)

    run(body)


def test_a_held_burst_of_a_power_of_two_is_estimated_exactly() -> None:
    async def body() -> None:
        async with stack([4, 4], estimator_interval_s=0.001, estimator_window=10) as (
            d,
            fake,
            url,
            s,
        ):
            all_up(d)
            await asyncio.sleep(0.05)  # idle samples must not drag the average below 8
            fake.gate.clear()
            tasks = [asyncio.create_task(post(s, url)) for _ in range(8)]
            while d.pending < 8:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)
            assert d.estimator.estimate == 8
            fake.gate.set()
            await asyncio.gather(*tasks)
            await asyncio.sleep(0.05)
            assert d.estimator.estimate == 8  # idle again: the estimate holds

    run(body)


def test_metrics_count_requests_per_instance() -> None:
    async def body() -> None:
        async with stack([1, 1]) as (d, _fake, url, s):
            all_up(d)
            for _ in range(4):
                await post(s, url)
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            assert 'packrat_requests_total{code="200",model="m"} 4.0' in text
            assert "packrat_request_duration_seconds_bucket" in text
            counts = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("packrat_instance_requests_total")
            ]
            assert sum(counts) == 4.0

    run(body)


def test_requests_follow_torchserve_when_its_ports_move() -> None:
    """``packrat serve`` sets ``backend_url`` again after TorchServe retried on another
    block of ports; forwarding must use the new address, not the one it was built with."""

    async def body() -> None:
        async with stack([1]) as (d, fake, url, s):
            all_up(d)
            real = d.backend_url
            d.backend_url = "http://127.0.0.1:9"  # discard port: nothing listens
            assert (await post(s, url, b"abc"))[0] == 503
            d.backend_url = real
            status, answer, _type, _headers = await post(s, url, b"abc")
            assert status == 200 and answer == b"cba"
            assert fake.arrived == 1

    run(body)
