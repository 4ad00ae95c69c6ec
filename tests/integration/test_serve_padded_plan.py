"""A padded plan served for real (issue 37 item 7): ``packrat serve`` with the operator's plan
for batch 3 on 2 cores, the plan for 4 (two 1-thread instances of batch 2, one slot idle).
Bursts of 3 are answered, every request, and ``/status`` shows the batch served and the
capacity held."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from packrat.bench.loadgen import Target, run_bursts
from packrat.plan.optimizer import Optimizer
from packrat.plan.padding import padded_plan
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.codec import example_body
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
READY_S = 300  # seconds when quiet, minutes on a loaded shared machine
CPUS = allowed_cpus()


async def _get(url: str) -> tuple[int, object]:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            return r.status, await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0, None


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a cpuset of at least 2 cpus")
def test_a_padded_plan_serves_its_batch(tmp_path: Path) -> None:
    plan = padded_plan(Optimizer({(1, 1): 5.0, (1, 2): 1.8}, cpus=2, max_batch=4), 3)
    assert (plan.batch, plan.capacity, plan.label) == (3, 4, "2x1t/b2")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", "tiny", "--plan",
           str(tmp_path / "plan.json"), "--host", "127.0.0.1", "--port", str(port),
           "--workdir", str(tmp_path / "work"), "--cpus", f"{CPUS[0]},{CPUS[1]}"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_S
        while asyncio.run(_get(f"{url}/ping"))[0] != 200:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        result = asyncio.run(
            run_bursts(Target(url, "tiny", example_body("tiny")), burst=3, bursts=5)
        )
        summary = result.summary()
        assert summary["requests"] == 15 and summary["errors"] == 0, summary
        code, status = asyncio.run(_get(f"{url}/status"))
        assert code == 200 and isinstance(status, dict)
        served = status["plan"]
        assert (served["batch"], served["capacity"], served["label"]) == (3, 4, "2x1t/b2")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=60) == 0, log.read_text(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
