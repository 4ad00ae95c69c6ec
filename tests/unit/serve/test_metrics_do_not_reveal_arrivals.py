"""Issue 38: public /metrics revealed the arrival log the admin token protects: a client
polling it between requests read each request's time from the counters. /metrics is now a
snapshot taken at most every METRICS_INTERVAL_S (Prometheus scrapes far less often), so it
shows counts at that granularity, never one request's time; the arrival log still needs the
token. Real dispatcher."""

from __future__ import annotations

import inspect

from dispatcher_support import all_up, post, run, stack

from packrat.serve.dispatcher.app import Dispatcher
from packrat.serve.dispatcher.endpoints import METRICS_INTERVAL_S


def test_metrics_polled_between_requests_do_not_change() -> None:
    assert METRICS_INTERVAL_S >= 2.0
    default = inspect.signature(Dispatcher).parameters["metrics_interval_s"].default
    assert default == METRICS_INTERVAL_S  # a pod's /metrics is a snapshot unless told

    async def main() -> None:
        # a long interval: the test runs within it whatever the machine's load
        async with stack([2], metrics_interval_s=60.0) as (d, _, front, session):
            all_up(d)
            async with session.get(f"{front}/metrics") as r:
                before = await r.read()
            for _ in range(3):
                assert (await post(session, front))[0] == 200
                async with session.get(f"{front}/metrics") as r:
                    assert r.status == 200 and await r.read() == before
            async with session.get(f"{front}/arrivals") as r:
                assert r.status in (401, 404)  # the log itself: the token's

    run(main)
