"""A plan on a converted engine served by the native runtime (real HTTP, tiny model): the
in-pod switch from an eager plan to an openvino plan and back under closed-loop load with no
failed request, the openvino plan's answers equal eager's (within the gate's tolerance), a
killed openvino worker restarted, and the refusals that come before any worker starts (the
TorchServe runtime, no artefact)."""

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

from packrat.runtime import engines
from packrat.runtime.cpus import allowed_cpus
from packrat.runtime.engines import cache
from packrat.runtime.zoo import load_model, model_digest
from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

CPUS = allowed_cpus()
TOKEN = "test-token-0123456789abcdef"
EAGER = {
    "cpus": 2,
    "batch": 4,
    "instances": [{"threads": 1, "batch": 2, "count": 2}],
    "expected_latency_ms": 1.0,
    "fat_latency_ms": 1.0,
}
OPENVINO = {**EAGER, "engine": "openvino"}


def _children(root: int) -> list[int]:
    """Worker processes of this pod: forked by its zygote (a child of ``root``), they keep the
    zygote's command line. Only this pod's tree counts: another pod's workers on the machine
    (another test, a run left behind) are not this pod's."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if b"packrat.serve.zygote.zygote" in cmd:
            parents[int(stat.parent.name)] = ppid
    zygotes = {pid for pid, ppid in parents.items() if ppid == root}
    return sorted(pid for pid, ppid in parents.items() if ppid in zygotes)


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


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    engine = engines.engine(engines.OPENVINO)
    if engine.missing() is not None:
        pytest.skip(engine.missing() or "")
    root = tmp_path_factory.mktemp("artefacts")
    cache.converted(
        engine,
        root=root,
        model_name="tiny",
        digest=model_digest("tiny"),
        inputs=engines.input_specs("tiny"),
        build=lambda: load_model("tiny"),
    )
    return root


def _serve_cmd(tmp: Path, plan: dict[str, Any], port: int, *extra: str) -> list[str]:
    (tmp / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", "tiny"]
    cmd += ["--plan", str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workdir", str(tmp / "work"), "--cpus", f"{CPUS[0]},{CPUS[1]}"]
    return [*cmd, *extra]


@pytest.fixture(scope="module")
def pod(
    tmp_path_factory: pytest.TempPathFactory, artefacts: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    if len(CPUS) < 2:
        pytest.skip("needs a cpuset of at least 2 cpus")
    tmp = tmp_path_factory.mktemp("engine-pod")
    port = free_ports(1)[0]
    cmd = _serve_cmd(tmp, EAGER, port, "--artefacts", str(artefacts), "--runtime", "native")
    cmd += ["--admin-token-env", "PACKRAT_TEST_ADMIN_TOKEN"]
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PACKRAT_TEST_ADMIN_TOKEN": TOKEN},
        )
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


async def _post_plan(s: aiohttp.ClientSession, url: str, plan: dict[str, Any]) -> Any:
    async with s.post(
        f"{url}/admin/plan",
        data=json.dumps(plan).encode(),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=aiohttp.ClientTimeout(total=300),
    ) as r:
        return r.status, json.loads(await r.text())


async def _predict(s: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes]:
    async with s.post(
        f"{url}/predictions/tiny",
        data=body,
        headers={"Content-Type": "application/octet-stream"},
    ) as r:
        return r.status, await r.read()


async def _metrics_once(s: aiohttp.ClientSession, url: str, showing: str) -> str:
    """``/metrics`` once it shows ``showing`` (the public page is a snapshot of up to 2 s
    ago, issue 38), or as it is after 30 s (the test's assertions then say what is missing)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
        if showing in text or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.2)


def test_switch_from_eager_to_openvino_and_back_fails_no_request(
    pod: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = pod
    body = example_body("tiny")
    statuses: Counter[int] = Counter()

    async def go() -> tuple[list[Any], list[Any], list[bytes]]:
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as s:

            async def client() -> None:
                while not stop.is_set():
                    status, _ = await _predict(s, url, body)
                    statuses[status] += 1

            answers = [(await _predict(s, url, body))[1]]  # eager's answer
            clients = [asyncio.ensure_future(client()) for _ in range(6)]
            while sum(statuses.values()) < 50:
                await asyncio.sleep(0.05)
            switched, docs = [], []
            for plan in (OPENVINO, EAGER):
                served = sum(statuses.values())
                switched.append(await _post_plan(s, url, plan))
                docs.append((await _get(f"{url}/status"))[1])
                engine = "openvino" if plan is OPENVINO else "eager"
                docs.append(await _metrics_once(s, url, f'engine="{engine}",model="tiny"}} 1.0'))
                if plan is OPENVINO:
                    answers.append((await _predict(s, url, body))[1])
                while sum(statuses.values()) < served + 50:
                    await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*clients)
            return switched, docs, answers

    switched, docs, answers = asyncio.run(asyncio.wait_for(go(), 360))
    assert [a[0] for a in switched] == [200, 200], switched
    assert switched[0][1]["plan"] == "2x1t/b2 openvino"
    assert docs[0]["plan"]["engine"] == "openvino"
    assert 'packrat_plan_engine{engine="openvino",model="tiny"} 1.0' in docs[1]
    assert 'packrat_plan_engine{engine="eager",model="tiny"} 0.0' in docs[1]
    assert 'packrat_plan_engine{engine="eager",model="tiny"} 1.0' in docs[3]
    assert switched[1][1]["plan"] == "2x1t/b2"
    assert set(statuses) == {200}, statuses  # zero failed requests through both switches
    eager_out, ov_out = (json.loads(a) for a in answers)
    assert max(abs(a - b) for a, b in zip(_flat(eager_out), _flat(ov_out), strict=True)) < 1e-3


def _flat(value: Any) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flat(v)]
    return [x for v in value for x in _flat(v)]


def test_a_killed_openvino_worker_is_restarted(pod: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = pod
    status, doc = asyncio.run(_switch_to(url, OPENVINO))
    assert status == 200, doc
    deadline = time.monotonic() + 120
    while len(before := _children(proc.pid)) != 2:
        assert time.monotonic() < deadline, before
        time.sleep(0.2)
    os.kill(before[0], signal.SIGKILL)
    while True:  # a new worker takes its place, and the plan answers again
        now = _children(proc.pid)
        if len(now) == 2 and before[0] not in now:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)

    async def answered() -> int:
        async with aiohttp.ClientSession() as s:
            for _ in range(600):
                status, _ = await _predict(s, url, example_body("tiny"))
                if status == 200:
                    return status
                await asyncio.sleep(0.1)
        return status

    assert asyncio.run(answered()) == 200


async def _switch_to(url: str, plan: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as s:
        return await _post_plan(s, url, plan)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--runtime", "torchserve", "--artefacts", "ART"], "serves eager plans only"),
        (["--runtime", "native", "--artefacts", "EMPTY"], "no openvino"),
        (["--runtime", "native"], "give --artefacts"),
    ],
)
def test_an_engine_plan_that_cannot_run_is_one_line(
    tmp_path: Path, artefacts: Path, extra: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"ART": str(artefacts), "EMPTY": str(tmp_path / "empty")}
    cmd = _serve_cmd(tmp_path, OPENVINO, free_ports(1)[0], *[paths.get(a, a) for a in extra])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
