"""controller/switch/plan_poster.py: when the in-pod switch applies, and the request it sends to a
pod."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from packrat.controller.core.fanout import Answer
from packrat.controller.core.model import model_spec
from packrat.controller.core.plans import from_status
from packrat.controller.switch import plan_poster
from packrat.controller.switch.plan_poster import (
    PlanPost,
    PlanPoster,
    PodAnswer,
    plan_request,
    post_plan,
)
from packrat.controller.switch.plan_poster import switchable as _switchable
from packrat.plan.optimizer import Plan
from packrat.serve.config import parse_plan

SPEC: dict[str, Any] = {"model": {"zoo": "resnet50"}, "cpus": 4, "batchSize": 8}
IMAGE = "ghcr.io/x/packrat:1"


def switchable(a: dict[str, Any], plan_a: Plan, b: dict[str, Any], plan_b: Plan) -> bool:
    typed = [model_spec(spec, image=IMAGE) for spec in (a, b)]
    return _switchable(typed[0], plan_a, typed[1], plan_b)


def _plan(count: int, threads: int, batch: int, cpus: int = 4) -> Plan:
    plan = from_status(
        {
            "label": f"{count}x{threads}t/b{batch}",
            "cpus": cpus,
            "batch": count * batch,
            "instances": [{"threads": threads, "batch": batch, "count": count}],
            "expectedLatencyMs": 10.0,
            "fatLatencyMs": 12.0,
        }
    )
    assert plan is not None
    return plan


def test_a_batch_change_on_the_same_cores_switches_in_the_pod() -> None:
    spec16 = {**SPEC, "batchSize": 16}
    assert switchable(SPEC, _plan(2, 2, 4), spec16, _plan(4, 1, 4))


@pytest.mark.parametrize(
    ("desired_spec", "desired_plan", "why"),
    [
        (SPEC, _plan(2, 2, 4), "the same plan: nothing to switch"),
        ({**SPEC, "cpus": 8}, _plan(2, 4, 4, cpus=8), "other cores: a new pod"),
        ({**SPEC, "model": {"zoo": "bert-base"}}, _plan(4, 1, 2), "another model"),
        ({**SPEC, "memory": "9Gi"}, _plan(4, 1, 2), "other pod resources"),
        ({**SPEC, "maxBatchDelayMs": 50}, _plan(4, 1, 2), "other TorchServe settings"),
    ],
)
def test_everything_else_keeps_the_deployment_switch(
    desired_spec: dict[str, Any], desired_plan: dict[str, Any], why: str
) -> None:
    assert not switchable(SPEC, _plan(2, 2, 4), desired_spec, desired_plan), why


def test_another_image_keeps_the_deployment_switch() -> None:
    current, desired = _plan(2, 2, 4), _plan(4, 1, 2)
    assert switchable(SPEC, current, SPEC, desired)
    other = {**SPEC, "image": "other:2"}
    assert not switchable(SPEC, current, other, desired)
    same = {**SPEC, "image": IMAGE}  # the default, spelled out: the same pods
    assert switchable(SPEC, current, same, desired)


def test_the_request_is_a_plan_the_pod_parses() -> None:
    body, headers = plan_request(_plan(4, 1, 2), token="t" * 20)
    assert headers["Authorization"] == "Bearer " + "t" * 20
    plan = parse_plan(body.decode(), origin="test")
    assert isinstance(plan, Plan)
    assert plan.label == "4x1t/b2" and plan.batch == 8 and plan.expand() == [(1, 2)] * 4


class _Pod(BaseHTTPRequestHandler):
    answers: list[tuple[int, bytes]] = []
    seen: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length", "0"))
        self.seen.append((self.path, self.headers.get("Authorization", ""), self.rfile.read(size)))
        status, body = self.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def pod() -> Iterator[int]:
    _Pod.answers, _Pod.seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pod)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_post_plan_reads_the_pods_answer(pod: int) -> None:
    _Pod.answers = [
        (200, json.dumps({"switched": True, "plan": "4x1t/b2"}).encode()),
        (503, json.dumps({"message": "new plan did not start"}).encode()),
        (200, b"x" * 100_000),  # too large: still the status, no message
    ]
    ok = post_plan(f"http://127.0.0.1:{pod}", _plan(4, 1, 2), token="t" * 20, timeout=30)
    assert ok.ok and ok.status == 200 and ok.message == "4x1t/b2"
    path, auth, body = _Pod.seen[0]
    assert path == "/admin/plan" and auth == "Bearer " + "t" * 20
    assert json.loads(body)["instances"] == [{"threads": 1, "batch": 2, "count": 4}]
    bad = post_plan(f"http://127.0.0.1:{pod}", _plan(4, 1, 2), token="t" * 20, timeout=30)
    assert not bad.ok and bad.status == 503 and "did not start" in bad.message
    big = post_plan(f"http://127.0.0.1:{pod}", _plan(4, 1, 2), token="t" * 20, timeout=30)
    assert big.ok and big.message == ""


def test_post_plan_to_nobody_is_an_answer_not_an_exception() -> None:
    from packrat.serve.torchserve.process import free_ports

    port = free_ports(1)[0]
    answer = post_plan(f"http://127.0.0.1:{port}", _plan(4, 1, 2), token="t" * 20, timeout=5)
    assert not answer.ok and answer.status == 0 and "unreachable" in answer.message


class _UnansweredFanout:
    """A pod client whose posts end only when the test says (their futures)."""

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[list[Answer]]] = []

    def submit(self, *_: Any, **__: Any) -> concurrent.futures.Future[list[Answer]]:
        future: concurrent.futures.Future[list[Answer]] = concurrent.futures.Future()
        self.futures.append(future)
        return future


def test_a_pending_post_is_picked_up_superseded_or_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fanout = _UnansweredFanout()
    poster = PlanPoster(fanout, inline_wait=0.0)  # type: ignore[arg-type]
    plan, token = _plan(2, 2, 4), "t" * 20

    def ask(owner: str = "ns/m", token: str = token) -> list[PodAnswer] | None:
        return poster(PlanPost(["http://a:8080"], plan, token=token, timeout=5.0, owner=owner))

    assert ask() is None and ask() is None  # pending: the second pass asks the same post
    assert len(fanout.futures) == 1 and poster.outstanding() == 1
    fanout.futures[0].set_result([Answer(200, b'{"plan": "2x2t/b4"}')])
    answers = ask()
    assert answers == [PodAnswer(ok=True, status=200, message="2x2t/b4")]
    assert answers[0].seconds > 0  # the whole post's time, not the picking pass's
    assert poster.outstanding() == 0
    assert ask() is None and ask(token="u" * 20) is None  # another token: a new post
    assert fanout.futures[1].cancelled() and not fanout.futures[2].cancelled()
    monkeypatch.setattr(plan_poster, "KEEP_SECONDS", -1.0)
    assert ask(owner="ns/other") is None  # the other model's post, kept too long, goes
    assert fanout.futures[2].cancelled() and poster.outstanding() == 1
