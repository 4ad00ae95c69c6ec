"""The pool process picks up a new configuration without a restart: its config file (a
mounted ConfigMap in a cluster) rewritten with one model dropped and one added, the dropped
model answers 404, the added one answers, and the model kept answers throughout (0 failed
requests while the file changes). A malformed file changes nothing.

Real process, real HTTP, real tiny PyTorch models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jsonhttp import http_json

from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

X = [float(i) / 16 for i in range(16)]


def _write(path: Path, names: list[str], tmp: Path) -> None:
    doc = {
        "directory": str(tmp / "files"),
        "budget_bytes": 1 << 22,
        "models": [{"name": n, "spec": "tiny"} for n in names],
    }
    (tmp / "next.json").write_text(json.dumps(doc))
    os.replace(tmp / "next.json", path)  # swapped in whole, as the kubelet does


def _wait(check: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_pool_reloads_its_config_while_serving(tmp_path: Path) -> None:
    config = tmp_path / "pool.json"
    _write(config, ["a", "b"], tmp_path)
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "pool.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "packrat.serve.pool", str(config), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    failures: list[int] = []
    served = [0]
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            code, _ = http_json(f"{url}/predictions/a", X)
            served[0] += 1
            if code != 200:
                failures.append(code)

    try:
        _wait(lambda: http_json(f"{url}/v2/health/ready")[0] == 200, "the pool ready")
        assert http_json(f"{url}/predictions/b", X)[0] == 200
        client = threading.Thread(target=load, daemon=True)
        client.start()
        _wait(lambda: served[0] > 5, "requests for a")
        config.write_text("{not json")  # malformed: reported, nothing changes
        _wait(lambda: b"last good configuration" in log.read_bytes(), "the bad file reported")
        assert http_json(f"{url}/predictions/b", X)[0] == 200
        _write(config, ["a", "c"], tmp_path)
        _wait(lambda: http_json(f"{url}/predictions/c", X)[0] == 200, "c served", timeout=180)
        assert http_json(f"{url}/predictions/b", X)[0] == 404
        before = served[0]
        _wait(lambda: served[0] > before + 5, "requests for a after the reload")
        stop.set()
        client.join(30)
        status = http_json(f"{url}/pool/status")[1]
        assert set(status["models"]) == {"a", "c"}
        assert failures == [], failures[:5]
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
        print(log.read_text(errors="replace")[-2000:])
