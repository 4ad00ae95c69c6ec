"""The in-pod plan switch under closed-loop load, on both runtimes (native workers, real
TorchServe): real HTTP, tiny model.

One ``packrat serve`` pod per runtime on 2 cpus serves ``2x1t/b2``; while clients keep
sending, the plan is switched in the pod to ``1x2t/b4`` and back. Every request must be
answered 200, the pod's ``/status`` must show the new plan's instances, and in the end only
the last plan's workers may be left running (the old ones were removed). Refusals: no token,
a wrong token and a plan that needs more cpus than the pod has, each with the old plan still
serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

CPUS = allowed_cpus()
TOKEN = "test-token-0123456789abcdef"


def _plan(count: int, threads: int, batch: int) -> dict[str, Any]:
    return {
        "cpus": 2,
        "batch": count * batch,
        "instances": [{"threads": threads, "batch": batch, "count": count}],
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.0,
    }


THIN = _plan(2, 1, 2)
FAT = _plan(1, 2, 4)


def _workers(root: int) -> list[int]:
    """Pids of worker processes below ``root``: forked by the pod's zygote (they keep its
    command line; native and TorchServe workers) or started fresh by TorchServe (not the
    launchers, which only name the script)."""
    parents: dict[int, list[int]] = {}
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
        parent_of[int(stat.parent.name)] = ppid
    out, frontier = [], [root]
    while frontier:
        frontier = [c for p in frontier for c in parents.get(p, [])]
        for pid in frontier:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            forked = b"packrat.serve.zygote.zygote" in cmd and parent_of.get(pid) != root
            fresh = b"model_service_worker" in cmd and b"worker_launcher" not in cmd
            if forked or fresh:
                out.append(pid)
    return out


async def _get(url: str) -> tuple[int, Any]:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            text = await r.text()
            return r.status, (json.loads(text) if text[:1] == "{" else None)
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


@pytest.fixture(scope="module", params=["native", "torchserve"])
def pod(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    if len(CPUS) < 2:
        pytest.skip("needs a cpuset of at least 2 cpus")
    tmp = tmp_path_factory.mktemp(f"inpod-{request.param}")
    (tmp / "plan.json").write_text(json.dumps(THIN))
    port = free_ports(1)[0]
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", "tiny"]
    cmd += ["--plan", str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workdir", str(tmp / "work"), "--cpus", f"{CPUS[0]},{CPUS[1]}"]
    cmd += ["--admin-token-env", "PACKRAT_TEST_ADMIN_TOKEN", "--runtime", request.param]
    env = {**os.environ, "PACKRAT_TEST_ADMIN_TOKEN": TOKEN}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while asyncio.run(_get(f"{url}/ping"))[0] != 200:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "not ready in 180 s:\n" + log.read_text()
            time.sleep(0.2)
        yield url, proc
    finally:
        print("--- serve log tail ---\n" + "\n".join(log.read_text().splitlines()[-30:]))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _post_plan(
    session: aiohttp.ClientSession, url: str, plan: dict[str, Any], token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.post(
        f"{url}/admin/plan",
        data=json.dumps(plan).encode(),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=300),
    ) as r:
        return r.status, json.loads(await r.text())


def test_switch_in_the_pod_under_load_fails_no_request(
    pod: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = pod
    body = example_body("tiny")
    statuses: Counter[int] = Counter()

    async def go() -> tuple[list[Any], list[dict[str, Any]]]:
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as s:

            async def client() -> None:
                while not stop.is_set():
                    async with s.post(
                        f"{url}/predictions/tiny",
                        data=body,
                        headers={"Content-Type": "application/octet-stream"},
                    ) as r:
                        await r.read()
                        statuses[r.status] += 1

            clients = [asyncio.ensure_future(client()) for _ in range(6)]
            while sum(statuses.values()) < 50:  # the load is running
                await asyncio.sleep(0.05)
            answers, docs = [], []
            for plan in (FAT, THIN):
                served = sum(statuses.values())
                answers.append(await _post_plan(s, url, plan))
                docs.append((await _get(f"{url}/status"))[1])
                while sum(statuses.values()) < served + 50:  # the new plan serves load
                    await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*clients)
            return answers, docs

    answers, docs = asyncio.run(asyncio.wait_for(go(), 360))
    assert [a[0] for a in answers] == [200, 200], answers
    assert answers[0][1]["plan"] == "1x2t/b4" and answers[0][1]["switched"] is True
    assert docs[0]["plan"]["instances"] == FAT["instances"]
    assert [i["name"] for i in docs[0]["instances"]] == ["tiny_g1_i0"]
    assert [i["name"] for i in docs[1]["instances"]] == ["tiny_g2_i0", "tiny_g2_i1"]
    assert all(i["up"] for i in docs[1]["instances"])
    assert set(statuses) == {200}, statuses  # zero failed requests, through both switches
    # The old generations' workers are unregistered: only the last plan's two remain.
    deadline = time.monotonic() + 120
    while len(_workers(proc.pid)) != 2:
        assert time.monotonic() < deadline, _workers(proc.pid)
        time.sleep(0.2)


def test_refusals_keep_the_plan_serving(pod: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = pod

    async def go() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as s:
            before = (await _get(f"{url}/status"))[1]["plan"]
            out = [
                await _post_plan(s, url, FAT, token=None),
                await _post_plan(s, url, FAT, token="wrong-token-wrong-token"),
                await _post_plan(s, url, {**_plan(3, 1, 1), "cpus": 3}),
                await _post_plan(s, url, {"cpus": "x"}),
            ]
            after = await _get(f"{url}/status")
            assert after[1]["plan"] == before and after[1]["ready"] is True
            return out

    out = asyncio.run(asyncio.wait_for(go(), 120))
    assert [o[0] for o in out] == [401, 401, 400, 400], out
    assert "cpus" in out[2][1]["message"]
    workers = _workers(proc.pid)
    assert workers
    for pid in workers:  # a user's handler code in a worker cannot read the admin token
        assert TOKEN.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
