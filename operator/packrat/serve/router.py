"""A pipeline's entry point: runs the DAG of stages over their Services, one query at a time.

``POST /predictions/{pipeline}`` takes the client's body to the root stages; each stage's
answer is the next stage's input (a join gets ``{"parent": answer, ...}`` as JSON). Which
edges a query takes: an edge with a condition (``when``) is taken when its source stage's
answer meets it, a header or a JSON field (:mod:`packrat.plan.pipeline.branch`: a cascade
calls its second stage only when the first is unsure); any other edge is drawn per query
from its fraction, as the planner's simulation assumes (:mod:`packrat.plan.pipeline.simulate`).
Stages not on the query's path are never called. The answer is the output of the last stage
on the path (several last stages: a JSON object by stage), with ``X-Packrat-Path`` listing
the stages that answered.

Errors stay with their query:

- a stage answering 4xx (bad input) fails the query with that status; 503 (shed) with 503;
  any other failure (5xx, connection refused, reset) with 502; every error body is JSON
  naming the stage, and other queries, on other paths or not, are not affected;
- every query has a deadline (``X-Packrat-Deadline-Ms`` from the client, at most the
  router's ``max_deadline_ms``, else its ``deadline_ms``): each stage call gets what is left
  of it (forwarded as ``X-Packrat-Deadline-Ms``), and when it runs out the query is answered
  504 naming the stage it was waiting on; the stages after it are not called.

Its port has the dispatcher's protections, from the same helpers
(:mod:`packrat.serve.dispatcher.connections`): a connection cap with a per-client share and
room kept for probes, a deadline for each request head and each body, a body cap (413,
before a byte is read), and one budget of bytes held across all queries, request bodies and
stage answers alike (503 beyond it). Stage calls follow no redirect (a 3xx is the stage's
failure, 502), and each answer is capped at ``max_answer_bytes`` (502 beyond it, the rest
unread), so one hostile stage or client cannot take the router past its memory limit.

Metrics (one registry per router): end-to-end and per-stage latency histograms, answers by
status code, stage failures by reason, and per stage and edge how many answers came back
and how many took the edge: the measured scale factors the planner can be given back
(:func:`packrat.plan.pipeline.branch.measured_fractions`). The stages' Services are plain
HTTP on the cluster network; the router itself listens on its one port.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from packrat.plan.pipeline.branch import Condition, known_mapping, parse_condition
from packrat.plan.pipeline.branch import taken as condition_taken
from packrat.plan.pipeline.simulate import Edge, PipelineError, topological_order
from packrat.serve.auth import AdminToken, bearer_accepted
from packrat.serve.dispatcher.arrivals import DEFAULT_LIMIT, ArrivalLog
from packrat.serve.dispatcher.connections import (
    BodyRefusedError,
    BufferBudget,
    ConnectionLimits,
    GuardedAppRunner,
    receive_body,
    refuse_body,
)
from packrat.serve.dispatcher.metrics import (
    METRICS_INTERVAL_S,
    MetricSet,
    Snapshot,
    counter,
    histogram,
)

DEADLINE_HEADER = "X-Packrat-Deadline-Ms"
PATH_HEADER = "X-Packrat-Path"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """What the router runs: stage name -> prediction URL, the edges, the deadlines."""

    pipeline: str
    stages: Mapping[str, str]
    edges: Sequence[Edge] = ()
    deadline_ms: float = 10_000.0
    max_deadline_ms: float = 60_000.0
    max_body_bytes: int = 6 * 1024 * 1024
    # a stage's answer is the next stage's input: the same cap as a request body
    max_answer_bytes: int = 6 * 1024 * 1024
    # bodies and answers held at once, across all queries (the router's limit is 256 MiB)
    max_buffered_bytes: int = 96 * 1024 * 1024
    body_timeout_s: float = 30.0
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)

    def __post_init__(self) -> None:
        if not 1 <= max(self.max_body_bytes, self.max_answer_bytes) <= self.max_buffered_bytes:
            raise PipelineError("need 1 <= max_body_bytes, max_answer_bytes <= max_buffered_bytes")
        if self.body_timeout_s <= 0:
            raise PipelineError("body_timeout_s must be > 0")
        if not self.stages:
            raise PipelineError("a pipeline needs at least one stage")
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in self.stages:
                    raise PipelineError(f"edge {e.src} -> {e.dst}: unknown stage {end!r}")
            if not (math.isfinite(e.fraction) and 0.0 <= e.fraction <= 1.0):
                raise PipelineError(f"edge {e.src} -> {e.dst}: fraction must be in [0, 1]")
        if not (0 < self.deadline_ms <= self.max_deadline_ms):
            raise PipelineError("deadlines must satisfy 0 < deadline_ms <= max_deadline_ms")


class StageFailedError(Exception):
    """One query failed at one stage; ``status`` is what the router answers."""

    def __init__(self, stage: str, status: int, reason: str, detail: str) -> None:
        super().__init__(f"stage {stage}: {detail}")
        self.stage, self.status, self.reason, self.detail = stage, status, reason, detail


@dataclass(frozen=True, slots=True)
class Answer:
    body: bytes
    content_type: str
    headers: Mapping[str, str] | None = None  # a stage's response headers, names lower-cased


class RouterMetrics(MetricSet):
    """Every metric the pipeline router exports, by pipeline. The operator reads three of them
    from each router pod (:mod:`packrat.controller.pipeline.latency`): :attr:`duration` for the
    pipeline's measured P99, :attr:`stage_answers` and :attr:`edges_taken` for the measured
    scale factors; their names are part of that contract."""

    shared_labels = ("pipeline",)

    duration = histogram(
        "packrat_pipeline_request_duration_seconds",
        "End-to-end time of a pipeline query, from receiving it to answering it.",
    )
    stage_duration = histogram(
        "packrat_pipeline_stage_duration_seconds",
        "Time a stage's Service took to answer the router, per stage.",
        "stage",
    )
    requests = counter(
        "packrat_pipeline_requests",
        "Pipeline queries answered, by HTTP status code.",
        "code",
    )
    stage_failures = counter(
        "packrat_pipeline_stage_failures",
        "Queries failed at a stage, by reason (status, unreachable, deadline).",
        "stage",
        "reason",
    )
    stage_answers = counter(
        "packrat_pipeline_stage_answers",
        "Answers a stage gave the router (queries that visited it and got through).",
        "stage",
    )
    edges_taken = counter(
        "packrat_pipeline_edges_taken",
        "Queries that took an edge after its source stage answered (by condition or draw).",
        "src",
        "dst",
    )


class Router:
    """Executes one pipeline's DAG per query (see the module docstring)."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        rng: random.Random | None = None,
        metrics: RouterMetrics | None = None,
        admin_token: AdminToken = None,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> None:
        self.config = config
        # ``/arrivals`` needs it, as a serving pod's (none: no ``/arrivals``, as a pod's)
        self.admin_token = admin_token
        self.metrics_interval_s = metrics_interval_s  # /metrics: a snapshot, as a pod's
        self._snapshot = Snapshot()
        self.order = topological_order(list(config.stages), config.edges)
        self.parents = {n: [e for e in config.edges if e.dst == n] for n in self.order}
        self.children = {n: [e for e in config.edges if e.src == n] for n in self.order}
        self.rng = rng or random.Random()
        self.metrics = metrics or RouterMetrics()
        self.budget = BufferBudget(config.max_buffered_bytes)
        # the pipeline's ingress, for the stages' tuners (each reads it times its scale factor)
        self.arrivals = ArrivalLog()
        self._session: aiohttp.ClientSession | None = None

    # -- HTTP ---------------------------------------------------------------------------------
    def runner(self, **kwargs: Any) -> web.AppRunner:
        """An app runner with the dispatcher's connection cap, per-client share, probe reserve
        and head deadline (what ``packrat route`` serves)."""
        kwargs.setdefault("access_log", None)
        return GuardedAppRunner(self.app(), limits=self.config.limits, **kwargs)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/predictions/{name}", self.handle_predict)
        app.router.add_post("/v2/models/{name}/infer", self.handle_v2)
        app.router.add_get("/ping", self.handle_ping)
        app.router.add_get("/metrics", self.handle_metrics)
        if self.admin_token:
            app.router.add_get("/arrivals", self.handle_arrivals)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256), auto_decompress=False
        )

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle_ping(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "Healthy"})

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        render = lambda: generate_latest(self.metrics.registry)  # noqa: E731
        body = self._snapshot.get(self.metrics_interval_s, render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_arrivals(self, request: web.Request) -> web.Response:
        """The pipeline's ingress after ``?after=`` (seconds since the epoch), as a serving
        pod's ``/arrivals``: the stages' tuners read it (``spec.autoscaling.ingress``), with
        the pipeline's admin token only (when each query came is its clients' business)."""
        if not bearer_accepted(request.headers.get("Authorization", ""), self.admin_token):
            return web.json_response({"error": "a valid bearer token is required"}, status=401)
        try:
            after = float(request.query.get("after", "0"))
            limit = int(request.query.get("limit", str(DEFAULT_LIMIT)))
        except ValueError:
            return web.json_response({"error": "after and limit must be numbers"}, status=400)
        if not math.isfinite(after) or not 1 <= limit <= DEFAULT_LIMIT:
            text = f"after must be finite, limit in 1..{DEFAULT_LIMIT}"
            return web.json_response({"error": text}, status=400)
        return web.json_response(self.arrivals.after(after, limit=limit))

    async def handle_predict(self, request: web.Request) -> web.Response:
        return await self._serve(request, self._predict)

    async def handle_v2(self, request: web.Request) -> web.Response:
        """The Open Inference Protocol's infer for the pipeline, as ``/predictions`` with each
        sample a query (:mod:`packrat.serve.router_v2`)."""
        from packrat.serve.router_v2 import infer

        return await self._serve(request, lambda r, b, d, h: infer(self, r, b, d, h))

    async def _predict(
        self, request: web.Request, body: bytes, deadline: float, held: Held
    ) -> web.Response:
        self.arrivals.record()  # admitted, its body whole: the pipeline's ingress
        ctype = request.headers.get("Content-Type", "application/octet-stream")
        return await self._run(Answer(body, ctype), deadline, held)

    async def _serve(self, request: web.Request, run: Any) -> web.Response:
        """Admission, the body, then ``run(request, body, deadline, held)``."""
        start = time.monotonic()
        name = self.config.pipeline
        if request.match_info["name"] != name:
            return self.answer(404, {"error": f"no pipeline {request.match_info['name']!r}"})
        try:
            budget_ms = self._budget(request.headers.get(DEADLINE_HEADER))
        except ValueError as exc:
            return self.answer(400, {"error": str(exc)})
        length = request.content_length
        if length is not None and length > self.config.max_body_bytes:
            return self._refuse(request, 413, "request body too large")
        held = Held(self.budget)
        size = length if length is not None else self.config.max_body_bytes
        # room for the body and one stage answer of its size (at least 64 KiB): a query
        # admitted when the budget is nearly full can still take its answers
        prepaid = min(self.config.max_answer_bytes, max(size, PREPAID_ANSWER_BYTES))
        if not held.take(size + prepaid):
            return self.answer(503, {"error": "too many bodies buffered"}, retry=True)
        held.prepaid = prepaid
        try:
            try:
                body = await receive_body(
                    request, length, self.config.max_body_bytes, self.config.body_timeout_s
                )
            except BodyRefusedError as exc:
                text = "request body too large" if exc.status == 413 else exc.message
                return self._refuse(request, exc.status, text)
            resp: web.Response = await run(request, body, start + budget_ms / 1000.0, held)
        finally:
            held.release()
        self.metrics.duration.labels(name).observe(time.monotonic() - start)
        return resp

    async def _run(self, query: Answer, deadline: float, held: Held) -> web.Response:
        path: list[str] = []
        try:
            answer = await self.execute(query, deadline, path, held)
        except StageFailedError as exc:
            self.metrics.stage_failures.labels(self.config.pipeline, exc.stage, exc.reason).inc()
            doc = {"error": exc.detail, "stage": exc.stage, "reason": exc.reason}
            return self.answer(exc.status, doc, path, retry=exc.status == 503)
        self.metrics.requests.labels(self.config.pipeline, "200").inc()
        return web.Response(
            body=answer.body,
            headers={"Content-Type": answer.content_type, PATH_HEADER: ",".join(path)},
        )

    def _refuse(self, request: web.Request, status: int, text: str) -> web.Response:
        """An answer without reading (the rest of) the body; the connection then closes."""
        resp = self.answer(status, {"error": text})
        resp.force_close()
        refuse_body(request)
        return resp

    def answer(
        self,
        status: int,
        doc: dict[str, Any],
        path: Sequence[str] | None = None,
        *,
        retry: bool = False,
    ) -> web.Response:
        """An answer in JSON, counted (``retry``: with ``Retry-After``)."""
        self.metrics.requests.labels(self.config.pipeline, str(status)).inc()
        headers = {PATH_HEADER: ",".join(path)} if path else {}
        if retry:
            headers["Retry-After"] = "1"
        return web.json_response(doc, status=status, headers=headers or None)

    def _budget(self, header: str | None) -> float:
        if header is None:
            return self.config.deadline_ms
        try:
            value = float(header)
        except ValueError:
            raise ValueError(f"{DEADLINE_HEADER} must be a number of ms, got {header!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{DEADLINE_HEADER} must be > 0, got {header!r}")
        return min(value, self.config.max_deadline_ms)

    # -- the DAG ------------------------------------------------------------------------------
    def draw(self) -> dict[tuple[str, str], bool]:
        """Which unconditional edges this query takes (each with its fraction, independently);
        an edge with a condition is decided later, by its source's answer."""
        return {
            (e.src, e.dst): self.rng.random() < e.fraction
            for e in self.config.edges
            if e.when is None
        }

    def takes(self, edge: Edge, drawn: Mapping[tuple[str, str], bool], answer: Answer) -> bool:
        """Whether a query whose ``edge.src`` answered ``answer`` goes on along ``edge``."""
        if edge.when is None:
            return drawn[(edge.src, edge.dst)]
        cond: Condition = edge.when
        return condition_taken(
            cond, headers=answer.headers or {}, body=answer.body, content_type=answer.content_type
        )

    async def execute(
        self, query: Answer, deadline: float, path: list[str], held: Held | None = None
    ) -> Answer:
        """Run one query through the DAG; raises :class:`StageFailedError` for the first stage
        that fails or runs past the deadline (the others are then cancelled). ``held``: the
        query's share of the buffer budget, which each stage answer and join is charged to."""
        drawn = self.draw()
        held = held or Held(self.budget)
        tasks: dict[str, asyncio.Task[Answer | None]] = {}
        name_ = self.config.pipeline

        async def visit(name: str) -> Answer | None:
            if not self.parents[name]:
                data: Answer | None = query
            else:
                ins = [e for e in self.parents[name] if e.when is not None or drawn[(e.src, e.dst)]]
                outs = {e.src: (e, await tasks[e.src]) for e in ins}
                got = {
                    k: a for k, (e, a) in outs.items() if a is not None and self.takes(e, drawn, a)
                }
                if not got:
                    return None  # not on this query's path
                for src in got:
                    self.metrics.edges_taken.labels(name_, src, name).inc()
                data = next(iter(got.values())) if len(got) == 1 else _join(got, held, name)
            assert data is not None
            answer = await self.call(name, data, deadline, held)
            self.metrics.stage_answers.labels(name_, name).inc()
            path.append(name)
            return answer

        for name in self.order:
            tasks[name] = asyncio.ensure_future(visit(name))
        try:
            results = await asyncio.gather(*tasks.values())
        except BaseException:
            for t in tasks.values():
                t.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            raise
        done = dict(zip(tasks, results, strict=True))
        last = {
            n: a
            for n, a in done.items()
            if a is not None and not any(done[e.dst] is not None for e in self.children[n])
        }
        return next(iter(last.values())) if len(last) == 1 else _join(last, held, "answer")

    async def call(
        self, name: str, data: Answer, deadline: float, held: Held | None = None
    ) -> Answer:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StageFailedError(name, 504, "deadline", "deadline exceeded before the stage")
        assert self._session is not None, "the router's app is not started"
        start = time.monotonic()
        headers = {"Content-Type": data.content_type, DEADLINE_HEADER: f"{left * 1000:.0f}"}
        try:
            async with asyncio.timeout(left):
                async with self._session.post(
                    self.config.stages[name],
                    data=data.body,
                    headers=headers,
                    allow_redirects=False,  # a stage's redirect is its failure, never followed
                ) as resp:
                    status = resp.status
                    ctype = resp.headers.get("Content-Type", "application/octet-stream")
                    got = {k.lower(): v for k, v in resp.headers.items()}
                    body = await self._read_answer(name, resp, held or Held(self.budget))
        except TimeoutError:
            raise StageFailedError(
                name, 504, "deadline", "deadline exceeded at the stage"
            ) from None
        except aiohttp.ClientError as exc:
            raise StageFailedError(name, 502, "unreachable", f"stage unreachable: {exc}") from None
        finally:
            self.metrics.stage_duration.labels(self.config.pipeline, name).observe(
                time.monotonic() - start
            )
        if status >= 300:
            code = status if 400 <= status < 500 or status == 503 else 502
            text = body[:200].decode("utf-8", "replace")
            raise StageFailedError(name, code, "status", f"stage answered {status}: {text}")
        return Answer(body, ctype, got)

    async def _read_answer(self, name: str, resp: aiohttp.ClientResponse, held: Held) -> bytes:
        """A stage's answer, at most ``max_answer_bytes`` and charged to the query's budget
        before it is read (its declared length, else the cap); the rest is never read."""
        cap = self.config.max_answer_bytes
        declared = resp.content_length
        if declared is not None and declared > cap:
            raise StageFailedError(name, 502, "too_large", f"stage answer over {cap} bytes")
        if not held.take_answer(declared if declared is not None else cap):
            raise StageFailedError(name, 503, "buffers", "the router's buffers are full")
        chunks: list[bytes] = []
        total = 0
        async for chunk in resp.content.iter_any():
            total += len(chunk)
            if total > cap:
                raise StageFailedError(name, 502, "too_large", f"stage answer over {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def _join(outputs: Mapping[str, Answer], held: Held, stage: str) -> Answer:
    """Several answers as one JSON object keyed by stage (JSON bodies embedded as JSON).

    Parsed JSON costs several times its text in Python objects: that much is charged to the
    query's budget first (503 when it does not fit). JSON nested too deep to parse is embedded
    as text; one too deep to write again fails the query (502), never the router (500)."""
    size = sum(len(a.body) for a in outputs.values())
    if not held.take(JOIN_COST * size):
        raise StageFailedError(stage, 503, "buffers", "the router's buffers are full")
    doc: dict[str, Any] = {}
    for name, a in outputs.items():
        text = a.body.decode("utf-8", "replace")
        try:
            doc[name] = json.loads(text) if "json" in a.content_type else text
        except (ValueError, RecursionError):
            doc[name] = text
    try:
        body = json.dumps(doc).encode()
    except (ValueError, RecursionError):
        raise StageFailedError(stage, 502, "join", "stage answers could not be joined") from None
    return Answer(body, "application/json")


JOIN_COST = 4  # bytes held per byte of answers joined (the text, its objects, the new text)


PREPAID_ANSWER_BYTES = 64 * 1024


class Held:
    """One query's bytes in the router's :class:`BufferBudget`, released together.
    ``prepaid``: bytes reserved at admission for the query's first stage answer."""

    def __init__(self, budget: BufferBudget) -> None:
        self.budget = budget
        self.bytes = 0
        self.prepaid = 0

    def take(self, n: int) -> bool:
        if not self.budget.reserve(n):
            return False
        self.bytes += n
        return True

    def take_answer(self, n: int) -> bool:
        """Room for a stage answer of ``n`` bytes: from the prepaid share while it lasts."""
        if n <= self.prepaid:
            self.prepaid -= n
            return True
        return self.take(n)

    def release(self) -> None:
        self.budget.release(self.bytes)
        self.bytes = 0


ROUTER_KEYS = {"pipeline", "stages", "edges", "deadlineMs", "maxDeadlineMs"}


def parse_router_config(doc: Any, *, origin: str = "<router config>") -> RouterConfig:
    """A router config document (what the operator renders into the router's ConfigMap)::

    pipeline: cascade
    stages: {screen: http://cascade-screen:8080/predictions/cascade-screen, ...}
    edges: [{from: screen, to: classify, fraction: 0.2, when: {json: confidence, below: 0.8}}]
    deadlineMs: 4000        # optional (default 10000)
    maxDeadlineMs: 60000    # optional (default 60000)
    """
    doc = known_mapping(doc, ROUTER_KEYS, where=origin, holding="pipeline, stages and edges")
    name = doc.get("pipeline")
    if not isinstance(name, str) or not name:
        raise PipelineError(f"{origin}: pipeline: expected a non-empty name")
    stages = doc.get("stages")
    if not isinstance(stages, Mapping) or not stages:
        raise PipelineError(f"{origin}: stages: expected a mapping of stage name to URL")
    for stage, url in stages.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise PipelineError(f"{origin}: stages.{stage}: expected an http(s) URL")
    edges = []
    for i, e in enumerate(doc.get("edges") or []):
        if (
            not isinstance(e, Mapping)
            or not {"from", "to"} <= set(e)
            or set(e) - {"from", "to", "fraction", "when"}
        ):
            raise PipelineError(
                f"{origin}: edges[{i}]: expected from, to and optional fraction and when"
            )
        fraction = e.get("fraction", 1.0)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise PipelineError(f"{origin}: edges[{i}].fraction: expected a number in [0, 1]")
        when = (
            parse_condition(e["when"], where=f"{origin}: edges[{i}].when") if "when" in e else None
        )
        edges.append(Edge(str(e["from"]), str(e["to"]), float(fraction), when))
    limits: dict[str, float] = {}
    for key, attr in (("deadlineMs", "deadline_ms"), ("maxDeadlineMs", "max_deadline_ms")):
        if key in doc:
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise PipelineError(f"{origin}: {key}: expected a number of ms > 0")
            limits[attr] = float(value)
    try:
        config = RouterConfig(
            name,
            dict(stages),
            edges,
            deadline_ms=limits.get("deadline_ms", 10_000.0),
            max_deadline_ms=limits.get("max_deadline_ms", 60_000.0),
        )
        topological_order(list(config.stages), config.edges)
    except PipelineError as exc:
        raise PipelineError(f"{origin}: {exc}") from None
    return config
