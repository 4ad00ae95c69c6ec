"""The operator's one pod client against hostile pods on loopback (issue 26, item 1 and the
"hostile values from a pod" items): a pod that drips its headers, sends a huge body,
redirects, accepts and never answers, or answers Infinity, 400- and 4000-digit numbers or a
list where an object belongs gives no value and holds nothing past the deadline, and a model
with many such pods cannot starve another model's reads."""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from kube_support import NS, T0, FakeKube, admin_secret, ready_model, set_spec

from packrat.controller.core.fanout import Answer, PodFanout, read_json
from packrat.controller.core.plans import from_status
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning.arrivals import ArrivalReader, parse_arrivals
from packrat.controller.planning.estimates import EstimateReader
from packrat.controller.serving import manifests as m
from packrat.controller.switch.inpod import PodClient, Poster
from packrat.controller.switch.plan_poster import PlanPost, PlanPoster

Behaviour = Callable[[socket.socket], None]
GOOD_STATUS = json.dumps({"batch_size_estimate": {"estimate": 4}}).encode()


def _answer(body: bytes, status: str = "200 OK", headers: str = "") -> Behaviour:
    def send(conn: socket.socket) -> None:
        _read_request(conn)
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
        conn.sendall(head.encode() + body)

    return send


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


class Hostile:
    """Loopback listeners, one per behaviour; ``stop`` ends every drip and blackhole."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.accepted: dict[str, int] = {}
        self._sockets: list[socket.socket] = []

    def listen(self, name: str, behaviour: Behaviour) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        self._sockets.append(server)
        self.accepted[name] = 0

        def serve() -> None:
            while not self.stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                self.accepted[name] += 1
                threading.Thread(target=self._handle, args=(conn, behaviour), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return int(server.getsockname()[1])

    def _handle(self, conn: socket.socket, behaviour: Behaviour) -> None:
        with conn, contextlib.suppress(OSError):
            behaviour(conn)

    def drip(self, conn: socket.socket) -> None:
        """Headers, one byte every 0.2 s, for a minute."""
        _read_request(conn)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 300:
            if self.stop.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    def blackhole(self, conn: socket.socket) -> None:
        """Accepts, reads, never answers."""
        _read_request(conn)
        self.stop.wait(120)

    def huge(self, conn: socket.socket) -> None:
        """A chunked body without end (no Content-Length to refuse up front)."""
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"[" * 65536)
        while not self.stop.is_set():
            conn.sendall(chunk)

    def close(self) -> None:
        self.stop.set()
        for server in self._sockets:
            server.close()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    pods = Hostile()
    yield pods
    pods.close()


def _pods(kube: FakeKube, name: str, ports: list[int]) -> None:
    """A model whose Service selects one ready pod per port (``pod_url`` http://{ip}:{pod})."""
    selector = {"app.kubernetes.io/instance": name, "packrat.dev/slot": "a"}
    kube.create("services", NS, {"metadata": {"name": name}, "spec": {"selector": selector}})
    admin_secret(kube, name)
    for port in ports:
        kube.create(
            "pods",
            NS,
            {
                "metadata": {"name": str(port), "labels": dict(selector)},
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )


def test_every_hostile_answer_is_no_estimate_and_nothing_waits_past_the_deadline(
    hostile: Hostile, kube: FakeKube
) -> None:
    target = hostile.listen("target", _answer(GOOD_STATUS))
    behaviours: dict[str, Behaviour] = {
        "good": _answer(GOOD_STATUS),
        "drip": hostile.drip,
        "blackhole": hostile.blackhole,
        "huge": hostile.huge,
        "long": _answer(b"x" * 100_000),
        "redirect": _answer(b"", "302 Found", f"Location: http://127.0.0.1:{target}/status\r\n"),
        "infinity": _answer(b'{"batch_size_estimate": {"estimate": Infinity}}'),
        "nan": _answer(b'{"batch_size_estimate": {"estimate": NaN}}'),
        "4000 digits": _answer(b'{"batch_size_estimate": {"estimate": %s}}' % (b"9" * 4000)),
        "1e400": _answer(b'{"batch_size_estimate": {"estimate": 1e400}}'),
        "list": _answer(b"[1, 2, 3]"),
        "string": _answer(b'{"batch_size_estimate": {"estimate": "8"}}'),
        "deep": _answer(b"[" * 10_000 + b"]" * 10_000),
    }
    ports = [hostile.listen(name, behaviour) for name, behaviour in behaviours.items()]
    _pods(kube, "m", ports)
    fanout = PodFanout()
    try:
        reader = EstimateReader(
            kube,
            pod_url="http://{ip}:{pod}",
            service_url="http://127.0.0.1:1/{service}",
            deadline=1.0,
            fanout=fanout,
        )
        reading = reader(NS, "m")
        assert not hostile.stop.is_set()  # the drip and the blackhole were still going
    finally:
        fanout.close()
    assert reading == ab.Reading((4,), "pods")  # only the well-behaved pod counts
    assert hostile.accepted["target"] == 0  # the redirect was not followed


def test_a_model_with_many_hostile_pods_cannot_starve_another_models_reads(
    hostile: Hostile, kube: FakeKube
) -> None:
    """Eight slots in all, two per model: the hostile model's 16 blackholes hold two of them
    until its deadline, and the other model's read still gets its answer."""
    evil = [hostile.listen(f"evil{i}", hostile.blackhole) for i in range(16)]
    good = hostile.listen("good", _answer(GOOD_STATUS))
    _pods(kube, "evil", evil)
    _pods(kube, "good", [good])
    fanout = PodFanout(total=8, per_owner=2)
    try:
        reader = EstimateReader(
            kube, pod_url="http://{ip}:{pod}", service_url="-", deadline=20.0, fanout=fanout
        )
        evil_reading: list[Any] = []
        thread = threading.Thread(target=lambda: evil_reading.append(reader(NS, "evil")))
        thread.start()
        deadline = time.monotonic() + 30
        while sum(v for k, v in hostile.accepted.items() if k.startswith("evil")) < 2:
            assert time.monotonic() < deadline, "the hostile model's reads never started"
            time.sleep(0.01)
        assert reader(NS, "good") == ab.Reading((4,), "pods")
        assert thread.is_alive()  # the hostile model is still waiting on its own pods
        # its other 14 pods never got a connection: it queued behind its own cap
        assert sum(v for k, v in hostile.accepted.items() if k.startswith("evil")) == 2
        hostile.close()  # every blackhole hangs up
        thread.join(timeout=60)
    finally:
        fanout.close()
    assert evil_reading == [None]


def test_arrivals_take_only_finite_bounded_numbers(hostile: Hostile, kube: FakeKube) -> None:
    docs = {
        "good": b'{"base": 100.0, "offsets_ms": [0, 500]}',
        "400 digits": b'{"base": 100.0, "offsets_ms": [%s]}' % (b"9" * 400),
        "1e400": b'{"base": 1e400, "offsets_ms": [0]}',
        "infinity": b'{"base": Infinity, "offsets_ms": [0]}',
        "list": b"[100.0, [0]]",
        "string base": b'{"base": "100", "offsets_ms": [0]}',
        "bool": b'{"base": 100.0, "offsets_ms": [true]}',
    }
    ports = [hostile.listen(name, _answer(doc)) for name, doc in docs.items()]
    _pods(kube, "m", ports)
    fanout = PodFanout()
    try:
        # the reader's cursor starts at its clock, a second before the good pod's arrivals
        # (it keeps only what came after it)
        reader = ArrivalReader(
            kube, pod_url="http://{ip}:{pod}", deadline=5.0, fanout=fanout, clock=lambda: 99.0
        )
        seen = reader(NS, "m")
    finally:
        fanout.close()
    assert seen is not None and list(seen.times) == [100.0, 100.5] and seen.pods == 1


def test_the_plan_post_reads_a_hostile_answer_and_gives_up_at_its_deadline(
    hostile: Hostile,
) -> None:
    plan = from_status(
        {
            "cpus": 2,
            "batch": 2,
            "instances": [{"threads": 1, "batch": 1, "count": 2}],
            "expectedLatencyMs": 1.0,
        }
    )
    assert plan is not None
    target = hostile.listen("target", _answer(b"{}"))
    moved = f"Location: http://127.0.0.1:{target}/admin/plan\r\n"
    behaviours: list[tuple[str, Behaviour]] = [
        ("list", _answer(b"[1, 2]")),
        ("drip", hostile.drip),
        ("blackhole", hostile.blackhole),
        ("redirect", _answer(b"", "307 Temporary Redirect", moved)),
        ("ok", _answer(b'{"plan": "2x1t/b1"}')),
    ]
    urls = [f"http://127.0.0.1:{hostile.listen(name, b)}" for name, b in behaviours]
    fanout = PodFanout()
    try:
        poster = PlanPoster(fanout, inline_wait=30.0)  # the answers in this call
        answers = poster(PlanPost(urls, plan, token="t" * 20, timeout=1.0, owner="ns/m"))
        assert answers is not None and not hostile.stop.is_set()
    finally:
        fanout.close()
    listed, drip, blackhole, redirect, ok = answers
    assert listed.ok and listed.message == ""  # a list is no message, and no crash
    assert not drip.ok and drip.status == 0 and "within" in drip.message
    assert not blackhole.ok and blackhole.status == 0
    assert not redirect.ok and redirect.status == 307 and hostile.accepted["target"] == 0
    assert ok.ok and ok.message == "2x1t/b1"


@pytest.mark.parametrize(
    "value",
    [float("inf"), float("nan"), 10**4000, 0, -1, 2**17, True, "8", 8.5, None, [8], {"e": 8}],
)
def test_an_estimate_out_of_range_or_of_the_wrong_type_is_none(value: Any) -> None:
    assert ab.parse_estimate({"batch_size_estimate": {"estimate": value}}) is None


def test_estimates_in_range_are_taken() -> None:
    assert ab.parse_estimate({"batch_size_estimate": {"estimate": 8}}) == 8
    assert ab.parse_estimate({"batch_size_estimate": {"estimate": 8.0}}) == 8
    assert ab.parse_estimate([8]) is None and ab.parse_estimate("x") is None


def test_strict_json_refuses_what_a_pod_must_not_send() -> None:
    for body in (b"Infinity", b"-Infinity", b"NaN", b"1e999", b"9" * 31, b"[" * 10**5):
        assert read_json(Answer(200, body)) is None
    assert read_json(Answer(200, b'{"a": [1, 2.5]}')) == {"a": [1, 2.5]}
    assert read_json(Answer(500, b"{}")) is None
    assert parse_arrivals({"base": 1, "offsets_ms": list(range(10))}) is not None


def _served_by(port: int, poster: Poster) -> tuple[FakeKube, Reconciler]:
    """A model serving from one pod on loopback ``port``, asked to change its batch (an
    in-pod switch)."""
    kube, rec = ready_model()
    pod = {
        "metadata": {"name": str(port), "labels": m.service_selector("tiny", slot="a")},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    kube.create("pods", NS, pod)
    set_spec(kube, batchSize=8)
    return kube, Reconciler(kube, config=rec.config, pods=PodClient("http://{ip}:{pod}", poster))


def _as_model(poster: PlanPoster, model: str) -> Poster:
    """The shared poster, for one of several models (the fake API holds one model, "tiny",
    per instance: each gets its own owner, as distinct models have)."""

    return lambda post: poster(replace(post, owner=f"{model}/{post.owner}"))


def test_blackholed_plan_posts_hold_no_reconcile_thread(hostile: Hostile) -> None:
    """Eight models whose pods accept the plan post and never answer, on eight reconcile
    threads, and a ninth model queued behind them: the ninth still switches at once (before
    any of the eight posts reaches its 30 s deadline); the eight end their passes with the post
    pending (InPodSwitchPending), and once their pods hang up, the next pass of each falls
    back to the Deployment switch with a Warning event."""
    fanout = PodFanout()
    poster = PlanPoster(fanout, inline_wait=0.5)
    good_port = hostile.listen("good", _answer(b'{"plan": "2x1t/b4"}'))
    hostile_models = [
        _served_by(hostile.listen(f"blackhole{i}", hostile.blackhole), _as_model(poster, f"h{i}"))
        for i in range(8)
    ]
    good_kube, good = _served_by(good_port, _as_model(poster, "good"))
    pool = ThreadPoolExecutor(max_workers=8)  # the operator's reconcile threads
    now = T0 + datetime.timedelta(seconds=1)
    try:
        started = time.monotonic()
        passes = [pool.submit(rec.reconcile, NS, "tiny", now=now) for _, rec in hostile_models]
        good_pass = pool.submit(good.reconcile, NS, "tiny", now=now)
        good_pass.result(timeout=25)  # with blocking posts: not before the 30 s deadline
        status = good_kube.prm()["status"]
        assert status["plan"]["batch"] == 8 and status["lastSwitch"]["mode"] == "InPod"
        for (kube, _), done in zip(hostile_models, passes, strict=True):
            result = done.result(timeout=25)
            assert result.waiting and result.switch_result is None
            status = kube.prm()["status"]
            reconfiguring = [c for c in status["conditions"] if c["type"] == "Reconfiguring"]
            assert reconfiguring[0]["reason"] == "InPodSwitchPending"
            assert status["plan"]["batch"] == 4  # still the served plan
        assert poster.outstanding() == 8  # every blackholed post is still out
        assert time.monotonic() - started < 30  # (so the passes did not wait for one to end)
        hostile.close()  # the pods hang up: every post ends, unanswered
        for kube, rec in hostile_models:
            deadline = time.monotonic() + 30
            while True:
                result = rec.reconcile(NS, "tiny", now=now)
                kinds = [(k, r) for k, r, _ in result.events]
                if ("Warning", "InPodSwitchFailed") in kinds or time.monotonic() > deadline:
                    break
            assert ("Warning", "InPodSwitchFailed") in kinds
            assert kube.prm()["status"]["switch"]["stage"] == "rollout"  # the Deployment switch
        assert poster.outstanding() == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        fanout.close()
