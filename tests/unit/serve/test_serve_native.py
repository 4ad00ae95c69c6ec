"""The native runtime without processes: its wire format, and one instance's batching, death
and restart against an in-process worker on the other end of a socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrat.serve.config import InstanceSpec
from packrat.serve.native import protocol
from packrat.serve.native.protocol import Item, ProtocolError, Result
from packrat.serve.native.runtime import NativeRuntime, NativeStartError, _Worker

items = st.lists(
    st.builds(Item, st.text(max_size=40), st.binary(max_size=200)), min_size=0, max_size=8
)


@given(st.integers(0, 2**32 - 1), items)
def test_a_batch_decodes_to_what_was_encoded(batch_id: int, batch: list[Item]) -> None:
    frame = protocol.encode_batch(batch_id, batch)
    assert protocol.frame_length(frame[:4]) == len(frame) - 4
    assert protocol.decode_batch(frame[4:]) == (batch_id, batch)


@given(
    st.integers(0, 2**32 - 1),
    st.lists(
        st.builds(Result, st.integers(100, 599), st.text(max_size=30), st.binary(max_size=99))
    ),
)
def test_a_reply_decodes_to_what_was_encoded(batch_id: int, results: list[Result]) -> None:
    frame = protocol.encode_reply(batch_id, results)
    assert protocol.decode_reply(frame[4:]) == (batch_id, results)


@given(st.binary(max_size=64))
def test_any_bytes_either_decode_or_are_a_protocol_error(payload: bytes) -> None:
    for decode in (protocol.decode_batch, protocol.decode_reply, protocol.decode_hello):
        with contextlib.suppress(ProtocolError):  # and nothing else
            decode(payload)


def test_truncated_frames_and_oversized_heads_are_refused() -> None:
    frame = protocol.encode_batch(7, [Item("application/json", b"[1, 2]")])
    with pytest.raises(ProtocolError):
        protocol.decode_batch(frame[4:-1])
    with pytest.raises(ProtocolError):
        protocol.decode_batch(frame[4:] + b"x")
    with pytest.raises(ProtocolError):
        protocol.frame_length(struct.pack("!I", protocol.MAX_FRAME + 1))
    with pytest.raises(ProtocolError):
        protocol.decode_reply(frame[4:])  # a batch is not a reply


# -- one instance against an in-process worker ----------------------------------------------------
Answer = Callable[[list[Item]], Awaitable[list[Result] | None]]


class FakeWorker:
    """The worker's side of the channel, in this process: says hello, then answers each batch
    with ``answer`` (None: dies, closing the channel, as a killed worker does)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.batches: list[list[Item]] = []
        self.started = 0

    async def run(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        writer.write(protocol.encode_hello({"ok": True, "pid": 4242 + self.started}))
        while True:
            head = await reader.readexactly(4)
            batch_id, batch = protocol.decode_batch(
                await reader.readexactly(protocol.frame_length(head))
            )
            self.batches.append(batch)
            results = await self.answer(batch)
            if results is None:
                writer.close()
                return
            writer.write(protocol.encode_reply(batch_id, results))


def _runtime(tmp: Path, worker: FakeWorker, *, delay_ms: int) -> NativeRuntime:
    runtime = NativeRuntime(
        workdir=tmp, model_dir=tmp, model_kind="model", weights=None, zygote=None,
        max_batch_delay_ms=delay_ms,
    )  # fmt: skip
    tasks: list[asyncio.Task[None]] = []

    async def spawn(_inst: InstanceSpec) -> _Worker:
        ours, theirs = socket.socketpair()
        tasks.append(asyncio.create_task(worker.run(theirs)))
        worker.started += 1
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        return _Worker(pid=4242 + worker.started - 1, reader=reader, writer=writer)

    runtime.spawn = spawn  # type: ignore[method-assign]
    return runtime


INST = InstanceSpec(index=0, name="m_i0", threads=1, batch=4, cpus=(0,))


def _echo(status: int = 200) -> Answer:
    async def answer(batch: list[Item]) -> list[Result]:
        return [Result(status, "application/json", json.dumps(len(batch)).encode()) for _ in batch]

    return answer


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


async def _forward(runtime: NativeRuntime, n: int) -> list[Any]:
    headers = {"Content-Type": "application/octet-stream"}
    return list(
        await asyncio.gather(*(runtime.forward("m_i0", headers, {}, b"x") for _ in range(n)))
    )


def test_requests_are_batched_up_to_the_batch_size(tmp_path: Path) -> None:
    worker = FakeWorker(_echo())

    async def go() -> None:
        runtime = _runtime(tmp_path, worker, delay_ms=200)
        sent: list[tuple[str, bool]] = []
        runtime.on_batch = lambda name, full: sent.append((name, full))
        await runtime.add(INST)
        answers = await _forward(runtime, 8)  # two full batches, no delay waited for
        assert sent == [("m_i0", True), ("m_i0", True)]  # both left full
        assert [a.status for a in answers] == [200] * 8
        assert [json.loads(a.body) for a in answers] == [4] * 8
        assert [len(b) for b in worker.batches] == [4, 4]
        assert (await runtime.workers("m_i0"))[0].ready
        await runtime.stop()
        assert await runtime.workers("m_i0") == []

    _run(go)


def test_a_part_batch_leaves_after_the_delay(tmp_path: Path) -> None:
    worker = FakeWorker(_echo())

    async def go() -> None:
        runtime = _runtime(tmp_path, worker, delay_ms=20)
        sent: list[tuple[str, bool]] = []
        runtime.on_batch = lambda name, full: sent.append((name, full))
        await runtime.add(INST)
        answers = await _forward(runtime, 3)
        assert [json.loads(a.body) for a in answers] == [3, 3, 3]
        assert sent == [("m_i0", False)]  # it left on the delay timeout
        await runtime.stop()

    _run(go)


def test_a_dead_worker_answers_its_batch_503_and_is_started_again(tmp_path: Path) -> None:
    deaths = [True]

    async def answer(batch: list[Item]) -> list[Result] | None:
        if deaths:
            deaths.pop()
            return None  # the first batch kills it
        return await _echo()(batch)

    worker = FakeWorker(answer)

    async def go() -> None:
        runtime = _runtime(tmp_path, worker, delay_ms=0)
        died: list[str] = []
        runtime.on_death = died.append  # the pod marks the instance down at once
        await runtime.add(INST)
        first = await _forward(runtime, 2)
        assert [a.status for a in first] == [503, 503] and died == ["m_i0"]
        assert all(a.headers["Retry-After"] == "1" for a in first)
        assert "died" in json.loads(first[0].body)["message"]
        for _ in range(200):  # restarted at once (the first failure waits no backoff)
            state = (await runtime.workers("m_i0"))[0]
            if state.ready:
                break
            await asyncio.sleep(0.01)
        assert state.ready and state.pid == 4243 and worker.started == 2
        assert [a.status for a in await _forward(runtime, 2)] == [200, 200]
        await runtime.stop()

    _run(go)


def test_a_worker_that_cannot_load_fails_its_add_with_its_reason(tmp_path: Path) -> None:
    async def go() -> None:
        runtime = NativeRuntime(
            workdir=tmp_path, model_dir=tmp_path, model_kind="model", weights=None,
            zygote=None, max_batch_delay_ms=0,
        )  # fmt: skip

        async def spawn(_inst: InstanceSpec) -> _Worker:
            ours, theirs = socket.socketpair()
            theirs.sendall(protocol.encode_hello({"ok": False, "error": "no such model"}))
            theirs.close()
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            return _Worker(pid=1, reader=reader, writer=writer)

        runtime.spawn = spawn  # type: ignore[method-assign]
        with pytest.raises(NativeStartError, match="no such model"):
            await runtime.add(INST)
        assert await runtime.workers("m_i0") == []
        unknown = await runtime.forward("m_i0", {}, {}, b"x")
        assert unknown.status == 503

    _run(go)


def test_a_worker_that_does_not_answer_in_time_is_replaced(tmp_path: Path) -> None:
    hangs = [True]

    async def answer(batch: list[Item]) -> list[Result] | None:
        if hangs:
            hangs.pop()
            await asyncio.sleep(3600)  # stuck (SIGSTOPped, deadlocked)
        return await _echo()(batch)

    worker = FakeWorker(answer)

    async def go() -> None:
        runtime = _runtime(tmp_path, worker, delay_ms=0)
        runtime.response_timeout_s = 0.2
        await runtime.add(INST)
        assert [a.status for a in await _forward(runtime, 2)] == [503, 503]
        for _ in range(200):
            if (await runtime.workers("m_i0"))[0].ready and worker.started == 2:
                break
            await asyncio.sleep(0.01)
        assert [a.status for a in await _forward(runtime, 1)] == [200]
        await runtime.stop()

    _run(go)


def test_a_reply_over_the_answer_cap_is_read_past_and_answered_502(tmp_path: Path) -> None:
    """Issue 38: a worker's reply is capped at its batch's answers (``max_answer_bytes`` each):
    a longer one is read past a chunk at a time, never held whole, its batch answered 502, and
    the worker goes on serving."""
    huge = [True]

    async def answer(batch: list[Item]) -> list[Result]:
        if huge:
            huge.pop()
            return [Result(200, "application/octet-stream", b"x" * (3 << 20)) for _ in batch]
        return await _echo()(batch)

    worker = FakeWorker(answer)

    async def go() -> None:
        runtime = _runtime(tmp_path, worker, delay_ms=0)
        runtime.max_answer_bytes = 1 << 20
        await runtime.add(INST)
        assert [a.status for a in await _forward(runtime, 1)] == [502]
        assert [a.status for a in await _forward(runtime, 1)] == [200]
        assert worker.started == 1  # not replaced: it only answered too much
        await runtime.stop()

    _run(go)


def test_a_huge_hello_is_a_failed_start(tmp_path: Path) -> None:
    """Trying the surface again (issue 38): a worker's hello (its pid and start-up marks) was
    read up to MAX_FRAME (512 MiB); a handler's process could make the pod hold that. It is
    capped at 64 KiB: a longer one is read past and the worker did not start."""

    class Bloated(FakeWorker):
        async def run(self, sock: socket.socket) -> None:
            _, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(protocol.encode_hello({"ok": True, "pid": 1, "pad": "x" * (2 << 20)}))
            await writer.drain()
            await asyncio.sleep(3600)

    async def go() -> None:
        runtime = _runtime(tmp_path, Bloated(_echo()), delay_ms=0)
        with pytest.raises(NativeStartError, match="hello"):
            await runtime.add(INST)
        await runtime.stop()

    _run(go)
