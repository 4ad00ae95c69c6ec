"""The pool serving process: several models in one process under a weight budget, each on its
own OIP v2 and /predictions names, cold starts that read the model's layers from its file,
eviction that really drops the pages (the status's resident bytes are measured with mincore).

Real process, real HTTP, real (tiny) PyTorch models with different weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from jsonhttp import http_json

from packrat.runtime import zoo
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODELS = {"a": 1, "b": 2, "c": 3, "d": 4}  # name -> seed
MODEL_BYTES = 6 * 4096  # tiny: one layer of 6 pages (its three Linear, 22 KB, under 1 MiB)
X = [float(i) / 16 for i in range(16)]


@pytest.fixture(scope="module", params=[("lru", "load"), ("lcache", "prefetch")])
def pool(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[str, str]]:
    policy, mode = request.param
    tmp = tmp_path_factory.mktemp(f"pool-{policy}")
    config = {
        "directory": str(tmp / "files"),
        "budget_bytes": 2 * MODEL_BYTES,
        "policy": policy,
        "mode": mode,
        "models": [{"name": n, "spec": "tiny", "seed": s} for n, s in MODELS.items()],
    }
    (tmp / "pool.json").write_text(json.dumps(config))
    port = free_ports(1)[0]
    log = tmp / "pool.log"
    cmd = [sys.executable, "-m", "packrat.serve.pool", str(tmp / "pool.json")]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while http_json(f"{url}/v2/health/ready")[0] != 200:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "not ready in 120 s:\n" + log.read_text()
            time.sleep(0.2)
        yield url, policy
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _expected(seed: int) -> list[float]:
    with torch.inference_mode():
        out: list[float] = zoo.load_model("tiny", seed=seed)(torch.tensor([X]))[0].tolist()
    return out


def test_every_model_answers_with_its_own_weights_and_cold_starts_are_counted(
    pool: tuple[str, str],
) -> None:
    url, policy = pool
    for name, seed in MODELS.items():
        status, got = http_json(f"{url}/predictions/{name}", X)
        assert status == 200, got
        assert got == pytest.approx(_expected(seed), abs=1e-5)
    doc = {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [1, 16], "data": X}]}
    status, got = http_json(f"{url}/v2/models/b/infer", doc)
    assert status == 200, got
    assert got["outputs"][0]["data"] == pytest.approx(_expected(2), abs=1e-5)
    _, state = http_json(f"{url}/pool/status")
    models = state["models"]
    assert all(models[n]["cold_starts"] >= 1 for n in MODELS)  # each started cold once
    assert sum(m["requests"] for m in models.values()) == 5
    assert state["resident_bytes"] <= state["budget_bytes"]  # measured, after eviction
    assert state["resident_bytes"] > 0
    if policy == "lru":  # a, b, c, d, then b: a and c were evicted whole, b and d stay
        assert models["b"]["cold_starts"] == 2
        assert [models[n]["resident_bytes"] for n in "abcd"] == [0, MODEL_BYTES, 0, MODEL_BYTES]
    status, text = http_json(f"{url}/v2/models/d")
    assert status == 200 and text["name"] == "d"


def test_bad_requests_fail_alone(pool: tuple[str, str]) -> None:
    url, _ = pool
    assert http_json(f"{url}/predictions/nope", [])[0] == 404
    status, got = http_json(f"{url}/predictions/a", body=b"not json")
    assert status == 400 and "JSON" in got["error"]
    status, got = http_json(f"{url}/v2/models/a/infer", {"inputs": 3})
    assert status == 400
    assert http_json(f"{url}/predictions/a", X)[0] == 200


def test_a_bad_configuration_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pool.json").write_text(json.dumps({"models": [{"name": "x", "spec": "nope"}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "packrat.serve.pool", str(tmp_path / "pool.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("packrat pool: error:")
    assert len(proc.stderr.strip().splitlines()) == 1
