"""The pipeline router over real HTTP stages: the DAG's data flow, errors that stay with their
queries, deadlines that cut the path, and its metrics."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from dispatcher_support import _serve, all_up, run, stack
from prometheus_client.parser import text_string_to_metric_families

from packrat.plan.pipeline.branch import measured_fractions, parse_condition
from packrat.plan.pipeline.simulate import Edge, PipelineError
from packrat.serve.router import DEADLINE_HEADER, PATH_HEADER, Router, RouterConfig

TOKEN = "router-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


class Stages:
    """Stage Services: each appends its name to the JSON list it gets (a join gets a dict);
    ``fail`` stages answer 500 to inputs containing "bad"; ``held`` stages never answer
    while their gate is clear; ``shed`` stages answer 503."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.gate = asyncio.Event()
        self.deadlines: list[float] = []
        self.app = web.Application()
        self.app.router.add_post("/{kind}/{name}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        kind, name = request.match_info["kind"], request.match_info["name"]
        self.calls[name] += 1
        self.deadlines.append(float(request.headers[DEADLINE_HEADER]))
        doc = await request.json()
        if kind == "held":
            await self.gate.wait()
        if kind == "fail" and "bad" in json.dumps(doc):
            return web.json_response({"error": "boom"}, status=500)
        if kind == "shed":
            return web.json_response({"error": "queue full"}, status=503)
        if kind == "screen":  # a small model: its confidence is the query's first number
            unsure = doc[0] < 0.8
            headers = {"X-Unsure": "true" if unsure else "false"}
            return web.json_response({"confidence": doc[0], "by": name}, headers=headers)
        out = [*doc, name] if isinstance(doc, list) else {"joined": doc, "by": name}
        return web.json_response(out)


@asynccontextmanager
async def pipeline(
    kinds: dict[str, str], edges: list[Edge], **config: float
) -> AsyncIterator[tuple[Router, Stages, str, aiohttp.ClientSession]]:
    stages = Stages()
    backend, base = await _serve(stages.app)
    urls = {n: f"{base}/{k}/{n}" for n, k in kinds.items()}
    if "down" in kinds.values():  # a Service with no listener behind it
        probe = web.AppRunner(web.Application())
        await probe.setup()
        site = web.TCPSite(probe, "127.0.0.1", 0)
        await site.start()
        port = probe.addresses[0][1]
        await probe.cleanup()
        urls.update({n: f"http://127.0.0.1:{port}/x" for n, k in kinds.items() if k == "down"})
    router = Router(
        RouterConfig("p", urls, edges, **config), rng=random.Random(7), admin_token=TOKEN
    )
    front, url = await _serve(router.app())
    try:
        async with aiohttp.ClientSession() as session:
            yield router, stages, f"{url}/predictions/p", session
    finally:
        stages.gate.set()
        await front.cleanup()
        await backend.cleanup()


async def ask(
    session: aiohttp.ClientSession, url: str, doc: object, **headers: str
) -> tuple[int, object, str]:
    async with session.post(url, json=doc, headers=headers) as r:
        return r.status, await r.json(), r.headers.get(PATH_HEADER, "")


def test_a_chain_feeds_each_answer_to_the_next_stage() -> None:
    async def body() -> None:
        async with pipeline(
            {"a": "ok", "b": "ok", "c": "ok"}, [Edge("a", "b"), Edge("b", "c")]
        ) as (_, stages, url, s):
            status, doc, path = await ask(s, url, ["in"])
            assert (status, doc, path) == (200, ["in", "a", "b", "c"], "a,b,c")
            assert stages.calls == Counter({"a": 1, "b": 1, "c": 1})

    run(body)


def test_a_join_gets_every_parent_and_waits_for_both() -> None:
    async def body() -> None:
        edges = [Edge("a", "b"), Edge("a", "c"), Edge("b", "d"), Edge("c", "d")]
        async with pipeline(dict.fromkeys("abcd", "ok"), edges) as (_, _s, url, s):
            status, doc, path = await ask(s, url, [])
            assert status == 200
            assert doc == {"joined": {"b": ["a", "b"], "c": ["a", "c"]}, "by": "d"}
            assert path.split(",")[0] == "a" and path.split(",")[-1] == "d"

    run(body)


def test_a_cascade_edge_is_taken_by_its_fraction_and_fraction_0_never() -> None:
    async def body() -> None:
        edges = [Edge("a", "b", 0.3), Edge("a", "c", 0.0)]
        async with pipeline({"a": "ok", "b": "ok", "c": "down"}, edges) as (_, stages, url, s):
            answers = [await ask(s, url, [i]) for i in range(200)]
            assert all(status == 200 for status, _, _ in answers)  # c is down, never called
            via_b = [doc for _, doc, path in answers if path == "a,b"]
            assert len(via_b) == stages.calls["b"]
            assert 30 <= len(via_b) <= 90  # 200 draws of p = 0.3: mean 60, sd 6.5
            assert all(doc[-1] == "a" for _, doc, path in answers if path == "a")

    run(body)


@pytest.mark.parametrize(
    "when",
    [{"json": "confidence", "below": 0.8}, {"header": "x-unsure", "equals": "true"}],
)
def test_a_cascade_branch_follows_the_first_stages_output(when: dict[str, object]) -> None:
    """The big model is called exactly for the queries the screen is unsure of (confidence
    below 0.8, read from its JSON answer or its header), never by chance; the router's
    counters give the measured fraction back."""

    async def body() -> None:
        edges = [Edge("screen", "big", 0.5, parse_condition(when))]
        async with pipeline({"screen": "screen", "big": "ok"}, edges) as (_, stages, url, s):
            confidences = [i / 40 for i in range(40)]  # 0.0 .. 0.975: 32 of 40 unsure
            answers = [await ask(s, url, [c]) for c in confidences]
            async with s.get(url.replace("/predictions/p", "/metrics")) as r:
                text = await r.text()
        for c, (status, doc, path) in zip(confidences, answers, strict=True):
            assert status == 200
            if c < 0.8:
                assert path == "screen,big"
                assert doc == {"joined": {"confidence": c, "by": "screen"}, "by": "big"}
            else:
                assert path == "screen" and doc == {"confidence": c, "by": "screen"}
        assert stages.calls["big"] == 32
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for m in text_string_to_metric_families(text)
            for x in m.samples
        }
        p = ("pipeline", "p")
        taken = {
            ("screen", "big"): samples[
                ("packrat_pipeline_edges_taken_total", (("dst", "big"), p, ("src", "screen")))
            ]
        }
        answered = {
            st: samples[("packrat_pipeline_stage_answers_total", (p, ("stage", st)))]
            for st in ("screen", "big")
        }
        assert answered == {"screen": 40, "big": 32}
        assert measured_fractions(taken, answered) == {("screen", "big"): 0.8}

    run(body)


def test_a_failing_stage_fails_only_its_queries() -> None:
    """Concurrent queries: those whose input makes stage b fail get 502 naming b; the rest,
    in flight at the same time, get their answers; a dead cascade stage fails only the
    queries routed to it."""

    async def body() -> None:
        edges = [Edge("a", "b"), Edge("b", "c", 0.5)]
        async with pipeline({"a": "ok", "b": "fail", "c": "down"}, edges) as (_, st, url, s):
            docs = [["bad"] if i % 3 == 0 else ["good", i] for i in range(60)]
            got = await asyncio.gather(*(ask(s, url, d) for d in docs))
            for d, (status, doc, path) in zip(docs, got, strict=True):
                if d == ["bad"]:
                    assert status == 502 and doc["stage"] == "b"  # type: ignore[index]
                    assert "500" in doc["error"] and path == "a"  # type: ignore[index]
                elif status == 502:
                    assert doc["stage"] == "c" and doc["reason"] == "unreachable"  # type: ignore[index]
                    assert path == "a,b"
                else:
                    assert (status, path) == (200, "a,b") and doc == [*d, "a", "b"]
            statuses = Counter(status for status, _, _ in got)
            assert statuses[200] > 0 and statuses[502] > 20
            assert st.calls["a"] == 60 and st.calls["b"] == 60

    run(body)


def test_stage_statuses_map_to_the_answer() -> None:
    async def body() -> None:
        async with pipeline({"a": "shed"}, []) as (_router, _, url, s):
            status, doc, _ = await ask(s, url, [])
            assert status == 503 and doc["stage"] == "a"  # type: ignore[index]
            status, doc, _ = await ask(s, url, [], **{DEADLINE_HEADER: "soon"})
            assert status == 400 and DEADLINE_HEADER in doc["error"]  # type: ignore[index]
            async with s.post(url.replace("/p", "/q"), json=[]) as r:
                assert r.status == 404

    run(body)


def test_a_deadline_cuts_the_path() -> None:
    """Stage b holds its answer: with a 300 ms budget the query is answered 504 naming b,
    and c is never called; a generous budget is forwarded, shrinking, to each stage."""

    async def body() -> None:
        edges = [Edge("a", "b"), Edge("b", "c")]
        kinds = {"a": "ok", "b": "held", "c": "ok"}
        async with pipeline(kinds, edges, deadline_ms=60_000.0) as (_, st, url, s):
            status, doc, path = await ask(s, url, [], **{DEADLINE_HEADER: "300"})
            assert status == 504 and doc["stage"] == "b" and doc["reason"] == "deadline"  # type: ignore[index]
            assert path == "a" and st.calls["c"] == 0
            st.gate.set()
            st.deadlines.clear()
            status, doc, _ = await ask(s, url, [])
            assert status == 200 and doc == ["a", "b", "c"]
            assert len(st.deadlines) == 3 and st.deadlines == sorted(st.deadlines, reverse=True)
            assert 0 < st.deadlines[-1] <= st.deadlines[0] <= 60_000

    run(body)


def test_metrics_count_queries_and_stages() -> None:
    async def body() -> None:
        async with pipeline({"a": "ok", "b": "fail"}, [Edge("a", "b")]) as (_, _st, url, s):
            for doc in (["x"], ["bad"], ["y"]):
                await ask(s, url, doc)
            async with s.get(url.replace("/predictions/p", "/metrics")) as r:
                text = await r.text()
            # the ingress, for the stages' tuners: every admitted query, as a pod's /arrivals
            arrivals = url.replace("/predictions/p", "/arrivals?after=0")
            async with s.get(arrivals, headers=BEARER) as r:
                ingress = await r.json()
            assert len(ingress["offsets_ms"]) == 3 and ingress["total"] == 3
            for bad in ("after=nan", "after=x", "limit=0"):
                arrivals = url.replace("/predictions/p", f"/arrivals?{bad}")
                async with s.get(arrivals, headers=BEARER) as r:
                    assert r.status == 400
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for m in text_string_to_metric_families(text)
            for x in m.samples
        }
        p = ("pipeline", "p")
        assert samples[("packrat_pipeline_requests_total", (("code", "200"), p))] == 2
        assert samples[("packrat_pipeline_requests_total", (("code", "502"), p))] == 1
        assert samples[("packrat_pipeline_request_duration_seconds_count", (p,))] == 3
        for stage in ("a", "b"):
            key = ("packrat_pipeline_stage_duration_seconds_count", (p, ("stage", stage)))
            assert samples[key] == 3
        fail = (p, ("reason", "status"), ("stage", "b"))
        assert samples[("packrat_pipeline_stage_failures_total", fail)] == 1

    run(body)


def test_the_router_runs_over_a_real_dispatcher() -> None:
    """A stage's Service is a Packrat dispatcher: the router's query goes through it."""

    async def body() -> None:
        async with stack([1]) as (dispatcher, fake, durl, _):
            all_up(dispatcher)
            config = RouterConfig("p", {"only": f"{durl}/predictions/m"})
            front, url = await _serve(Router(config).app())
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(f"{url}/predictions/p", data=b"abc") as r,
                ):
                    assert r.status == 200 and await r.read() == b"cba"
                    assert r.headers[PATH_HEADER] == "only"
                assert fake.calls["m_i0"] == 1
            finally:
                await front.cleanup()

    run(body)


@pytest.mark.parametrize(
    ("stages", "edges", "message"),
    [
        ({}, [], "at least one stage"),
        ({"a": "u"}, [Edge("a", "b")], "unknown stage 'b'"),
        ({"a": "u", "b": "u"}, [Edge("a", "b", -1.0)], "fraction"),
    ],
)
def test_bad_router_configs_are_refused(
    stages: dict[str, str], edges: list[Edge], message: str
) -> None:
    with pytest.raises(PipelineError, match=message):
        RouterConfig("p", stages, edges)


def test_a_cycle_is_refused() -> None:
    config = RouterConfig("p", {"a": "u", "b": "u"}, [Edge("a", "b"), Edge("b", "a")])
    with pytest.raises(PipelineError, match="cycle"):
        Router(config)
