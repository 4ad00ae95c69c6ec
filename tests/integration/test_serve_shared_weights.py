"""``packrat serve`` with two tiny instances that map the pod's one weight file, on both
runtimes (native workers, real TorchServe).

Real HTTP: the answers must equal the model run in-process, and both workers' tensors must
be the pod's one copy: on TorchServe the file mapped once by the pod's zygote, which forked
both workers (it shows in their ``/proc/<pid>/maps``); on the native runtime the model the
zygote built before forking them, the file written behind for a later start. The pod's
start-up timeline is in its log and its metrics.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from packrat.runtime import zoo
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import encode_sample
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CPUS = allowed_cpus()


async def _get(url: str) -> tuple[int, Any]:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            text = await r.text()
            return r.status, (json.loads(text) if r.status == 200 and text[:1] == "{" else None)
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


@pytest.fixture(scope="module", params=["native", "torchserve"])
def pod(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Path, Path]]:
    if len(CPUS) < 2:
        pytest.skip("needs a cpuset of at least 2 cpus")
    tmp = tmp_path_factory.mktemp(f"shared-{request.param}")
    plan = {
        "cpus": 2,
        "batch": 4,
        "instances": [{"threads": 1, "batch": 2, "count": 2}],
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.0,
    }
    (tmp / "plan.json").write_text(json.dumps(plan))
    port = free_ports(1)[0]
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", "tiny"]
    cmd += ["--plan", str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workdir", str(tmp / "work"), "--cpus", f"{CPUS[0]},{CPUS[1]}"]
    cmd += ["--runtime", request.param]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while asyncio.run(_get(f"{url}/ping"))[0] != 200:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "not ready in 120 s:\n" + log.read_text()
            time.sleep(0.2)
        yield url, tmp / "work", log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_answers_equal_the_model_run_in_process(pod: tuple[str, Path, Path]) -> None:
    url = pod[0]
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = zoo.load_model("tiny")(x)

    async def go() -> list[tuple[int, bytes]]:
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> tuple[int, bytes]:
                async with s.post(
                    f"{url}/predictions/tiny",
                    data=encode_sample([x[i]]),
                    headers={"Content-Type": "application/octet-stream"},
                ) as r:
                    return r.status, await r.read()

            return list(await asyncio.gather(*(one(i) for i in range(4))))

    for i, (status, body) in enumerate(asyncio.run(go())):
        assert status == 200, body
        got = torch.tensor(json.loads(body))
        assert torch.allclose(got, expected[i], atol=1e-6), (got, expected[i])


def _mappers(target: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            maps = (proc / "maps").read_text()
        except OSError:  # gone, or not ours to read
            continue
        if any(line.endswith(target) for line in maps.splitlines()):
            found.append(int(proc.name))
    return found


def test_both_workers_share_the_one_copy_of_the_weights(pod: tuple[str, Path, Path]) -> None:
    work = pod[1]
    deadline = time.monotonic() + 60  # the native zygote writes the file behind the start
    while not list((work / "weights").glob("*.weights.pt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    files = list((work / "weights").glob("*.weights.pt"))
    assert len(files) == 1, files
    worker_logs = [work / "logs" / "model_log.log", *(work / "native").glob("*.log")]
    logs = "".join(p.read_text(errors="replace") for p in worker_logs if p.exists())
    if (work / "native").is_dir():
        # Both workers run the model the zygote built before it forked them (its pages,
        # shared copy-on-write), not the file, which is for a later start.
        assert logs.count("built before the fork, shared with the zygote") == 2, logs[-2000:]
        assert _mappers(str(files[0].resolve())) == []
        return
    mappers = _mappers(str(files[0].resolve()))
    # The zygote (it built the model before forking) and the two workers forked from it.
    parent = {
        pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for pid in mappers
    }
    zygotes = [pid for pid in mappers if parent[pid] not in mappers]
    assert len(zygotes) == 1, parent
    assert b"packrat.serve.zygote.zygote" in Path(f"/proc/{zygotes[0]}/cmdline").read_bytes()
    workers = [pid for pid in mappers if parent[pid] == zygotes[0]]
    assert len(workers) == 2 and len(mappers) == 3, parent  # nothing else maps it
    mapped = f"100% mapped from {files[0].name}, built before the fork"
    assert logs.count(mapped) == 2, logs[-2000:]


def test_the_start_up_timeline_is_logged_and_exported(pod: tuple[str, Path, Path]) -> None:
    url, work, log = pod
    line = next(x for x in log.read_text().splitlines() if "after the process started:" in x)
    total = float(line.split("ready ", 1)[1].split(" s ", 1)[0])
    at = {
        step: float(value)
        for step, value in (part.split(" +") for part in line.split("started: ", 1)[1].split(", "))
    }
    chain = ["zygote_spawned", "torch_imported", "model_built", "zygote_listening"]
    if (work / "native").is_dir():
        chain += ["workers_forked", "workers_loaded"]
    chain += ["workers_warmed", "ready"]
    assert [at[step] for step in chain] == sorted(at[step] for step in chain), line
    assert at["zygote_spawned"] > 0 and at["dispatcher_listening"] <= at["ready"] == total
    metrics = asyncio.run(_text(f"{url}/metrics"))
    assert 'packrat_startup_seconds{model="tiny",step="ready"}' in metrics


async def _text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()
