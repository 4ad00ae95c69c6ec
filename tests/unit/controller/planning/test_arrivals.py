"""The arrivals path for the tuner: the dispatcher's bounded arrival log and ``/arrivals``, and
the operator's reader merging real dispatchers' answers (cursors, junk, unreachable pods)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from dispatcher_support import all_up, post, run, stack
from hypothesis import given
from hypothesis import strategies as st
from kube_support import ADMIN_TOKEN, admin_secret

from packrat.controller.planning.arrivals import ArrivalReader, parse_arrivals
from packrat.serve.dispatcher.arrivals import ArrivalLog


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@given(
    st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=60),
    st.integers(1, 40),
    st.floats(min_value=-1, max_value=200, allow_nan=False),
    st.integers(1, 80),
)
def test_log_is_bounded_sorted_and_pages_without_loss(
    gaps: list[float], capacity: int, after: float, limit: int
) -> None:
    clock = Clock(100.0)
    log = ArrivalLog(capacity=capacity, clock=clock)
    seen: list[float] = []
    for gap in gaps:
        clock.t += gap
        log.record()
        seen.append(clock.t)
    kept = seen[-capacity:]
    assert len(log) == len(kept) and log.total == len(gaps)
    doc = log.after(after, limit=limit)
    times = [doc["base"] + o / 1000.0 for o in doc["offsets_ms"]]
    want = [t for t in kept if t > after + 1e-6][:limit]
    assert len(times) == len(want)
    assert all(abs(a - b) < 2e-6 for a, b in zip(times, want, strict=True))
    assert doc["more"] == (len([t for t in kept if t > after + 1e-6]) > limit)


def test_a_clock_stepping_back_keeps_the_log_sorted() -> None:
    clock = Clock(10.0)
    log = ArrivalLog(clock=clock)
    log.record()
    clock.t = 9.0
    log.record()
    doc = log.after(0)
    assert doc["offsets_ms"] == [0.0, 0.0]


BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_dispatcher_stamps_each_request_and_serves_them_after_a_cursor() -> None:
    async def body() -> None:
        async with stack([2], admin_token=ADMIN_TOKEN) as (d, _fake, url, s):
            all_up(d)
            start = time.time()
            for _ in range(5):
                status, *_ = await post(s, url)
                assert status == 200
            async with s.get(f"{url}/arrivals", headers=BEARER) as r:
                assert r.status == 200
                doc = await r.json()
            times = parse_arrivals(doc)
            assert times is not None and len(times) == 5
            assert all(start - 1 <= t <= time.time() + 1 for t in times)
            after = {"after": str(times[2])}
            async with s.get(f"{url}/arrivals", params=after, headers=BEARER) as r:
                later = parse_arrivals(await r.json())
            assert later is not None and len(later) == 2
            for bad in ({"after": "soon"}, {"after": "inf"}, {"limit": "0"}):
                async with s.get(f"{url}/arrivals", params=bad, headers=BEARER) as r:
                    assert r.status == 400

    run(body)


def test_arrivals_need_the_admin_token() -> None:
    """Who sent requests when is the model's clients' business: no token, a wrong one, a
    token in another scheme or with a suffix are 401 (and the log is not read); a pod started
    without an admin token has no /arrivals at all."""

    async def body() -> None:
        async with stack([1], admin_token=ADMIN_TOKEN) as (d, _fake, url, s):
            all_up(d)
            assert (await post(s, url))[0] == 200
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-0123456789"},
                {"Authorization": f"Basic {ADMIN_TOKEN}"},
                {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
                {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
            ):
                async with s.get(f"{url}/arrivals", headers=headers) as r:
                    assert r.status == 401
                    assert "offsets_ms" not in await r.text()
            async with s.get(f"{url}/arrivals", headers=BEARER) as r:
                assert r.status == 200
                assert len((await r.json())["offsets_ms"]) == 1
        async with stack([1]) as (d, _fake, url, s):
            all_up(d)
            async with s.get(f"{url}/arrivals", headers=BEARER) as r:
                assert r.status == 404

    run(body)


def test_parse_arrivals_refuses_junk() -> None:
    assert parse_arrivals({"base": 5, "offsets_ms": [0, 1000]}) == [5.0, 6.0]
    for junk in (
        None,
        [],
        {"base": "x"},
        {"base": 1, "offsets_ms": "no"},
        {"base": float("inf"), "offsets_ms": []},
    ):
        assert parse_arrivals(junk) is None


class PodsKube:
    """Just enough API for the reader: the Service's selector and its ready pods."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.secrets: dict[str, dict[str, Any]] = {}

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        if resource == "secrets":
            return self.secrets.get(name)
        assert resource == "services"
        return {"spec": {"selector": {"app": name}}}

    def create(self, resource: str, namespace: str, body: dict[str, Any]) -> bool:
        assert resource == "secrets"
        self.secrets[body["metadata"]["name"]] = body
        return True

    def list(self, resource: str, namespace: str, **_: Any) -> list[dict[str, Any]]:
        return self.pods


def _pod(name: str, port: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "phase": "Running",
            "podIP": f"127.0.0.1:{port}",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_reader_merges_two_real_dispatchers_and_reads_each_arrival_once() -> None:
    async def body() -> None:
        token = {"admin_token": ADMIN_TOKEN}
        async with (
            stack([1], **token) as (d1, _f1, url1, s),
            stack([1], **token) as (d2, _f2, url2, _),
        ):
            all_up(d1)
            all_up(d2)
            port1, port2 = int(url1.rsplit(":", 1)[1]), int(url2.rsplit(":", 1)[1])
            kube = PodsKube([_pod("p1", port1), _pod("p2", port2), _pod("gone", 9)])
            admin_secret(kube, "m")
            reader = ArrivalReader(kube, pod_url="http://{ip}", deadline=5.0)  # the pods' clock
            loop = asyncio.get_running_loop()
            first = await loop.run_in_executor(None, reader, "ns", "m")
            assert first is not None and first.pods == 2 and list(first.times) == []
            for _ in range(3):
                await post(s, url1)
            for _ in range(2):
                await post(s, url2)
            second = await loop.run_in_executor(None, reader, "ns", "m")
            assert second is not None and len(second.times) == 5
            assert list(second.times) == sorted(second.times)
            await post(s, url2)
            third = await loop.run_in_executor(None, reader, "ns", "m")
            assert third is not None and len(third.times) == 1  # only what is new
            kube.pods = [_pod("gone", 9)]
            assert await loop.run_in_executor(None, reader, "ns", "m") is None

    run(body)


def test_reader_ignores_a_pod_answering_junk() -> None:
    assert parse_arrivals(json.loads('{"base": 1, "offsets_ms": [1, "x"]}')) is None
