"""A user's .mar on a converted engine, end to end (real torch-model-archiver archives, real
processes, real HTTP): `packrat profile --engines eager,onnxruntime` captures the handler's
module inputs from the sample request, converts the module once and gates it against eager,
profiles it through the handler with the module swapped; `packrat serve` (native runtime)
serves the onnxruntime plan through the same handler, answering as eager does. A handler
with no module is profiled eager, the engines left out in one line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from mar_support import archive
from serve_support import start_serving, stop_serving

from packrat.plan.profile import ENGINES_KEY, load_profile
from packrat.runtime import engines
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CPUS = allowed_cpus()

LINEAR = """
import json
import torch


class LinearHandler:
    def initialize(self, context):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 4).eval()

    def handle(self, data, context):
        x = torch.tensor([row.get("body", row.get("data")) for row in data], dtype=torch.float32)
        with torch.inference_mode():
            y = self.model(x)
        return [json.dumps(row) for row in y.tolist()]
"""

NO_MODULE = """
import json
import torch


class WeightsHandler:
    def initialize(self, context):
        self.weights = torch.linspace(-1.0, 1.0, 8)

    def handle(self, data, context):
        x = torch.tensor([row.get("body", row.get("data")) for row in data], dtype=torch.float32)
        return [json.dumps(float(v)) for v in (x @ self.weights).tolist()]
"""


@pytest.fixture(scope="module")
def mars(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mar-engines")
    for name, source in (("linear", LINEAR), ("nomodule", NO_MODULE)):
        (tmp / f"{name}_handler.py").write_text(source)
        archive(tmp, name, tmp / f"{name}_handler.py")
    (tmp / "sample.json").write_text(json.dumps([0.5] * 8))
    return {"linear": tmp / "linear.mar", "nomodule": tmp / "nomodule.mar", "tmp": tmp}


def _profile(mar: Path, out: Path, artefacts: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "packrat", "profile", "--model", str(mar)]
    cmd += ["--sample-request", str(mar.parent / "sample.json")]
    cmd += ["--sample-content-type", "application/json", "--engines", "eager,onnxruntime"]
    cmd += ["--artefacts", str(artefacts), "--cpus", "1", "--threads", "1", "--max-batch", "2"]
    cmd += ["--point-budget", "0.5", "--precision", "0.3", "--allow-contended", "-o", str(out)]
    return subprocess.run(
        ["nice", "-n", "5", *cmd], capture_output=True, text=True, timeout=400, check=False
    )


def _need_onnxruntime() -> None:
    reason = engines.engine(engines.ONNXRUNTIME).missing()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def profiled(mars: dict[str, Path]) -> tuple[Path, Path, str]:
    _need_onnxruntime()
    out, artefacts = mars["tmp"] / "linear.json", mars["tmp"] / "artefacts"
    done = _profile(mars["linear"], out, artefacts)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, artefacts, done.stderr


def test_the_handlers_module_is_converted_gated_and_profiled(
    profiled: tuple[Path, Path, str],
) -> None:
    out, artefacts, stderr = profiled
    assert "engine onnxruntime: converted" in stderr and "matches eager" in stderr, stderr
    profile = load_profile(out)
    assert profile.meta.extra["through"] == "handler"
    assert profile.engines == ["eager", "onnxruntime"]
    record = profile.meta.extra[ENGINES_KEY]["onnxruntime"]
    assert record["status"] == "ok" and record["check"]["worst"] <= 1.0
    assert Path(record["artefact"]["path"]).is_file()
    (inputs,) = artefacts.glob("linear-*/handler-inputs.json")
    assert json.loads(inputs.read_text())["inputs"] == [
        {"shape": [8], "dtype": "float32", "high": 0}
    ]
    assert (1, 2) in profile.for_engine("onnxruntime").index


def test_a_second_profile_finds_the_conversion(
    profiled: tuple[Path, Path, str], mars: dict[str, Path]
) -> None:
    _, artefacts, _ = profiled
    done = _profile(mars["linear"], mars["tmp"] / "again.json", artefacts)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine onnxruntime: found converted" in done.stderr, done.stderr


def _convert(
    mar: Path, artefacts: Path, *sample: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "packrat", "convert", "--model", str(mar), *sample]
    cmd += ["--engines", "eager,onnxruntime", "--artefacts", str(artefacts)]
    return subprocess.run(
        ["nice", "-n", "5", *cmd], capture_output=True, text=True, timeout=300, check=False, env=env
    )


def test_a_pods_convert_finds_the_jobs_conversion_and_converts_its_own_from_the_request(
    profiled: tuple[Path, Path, str], mars: dict[str, Path], tmp_path: Path
) -> None:
    """What a serving pod's init container runs: with the profile's artefacts (a shared
    claim) it finds the Job's conversion under the same key; in a pod's own empty volume it
    converts the module from the sample request (base64 in a variable, as the pod gets it)."""
    _, artefacts, _ = profiled
    env_sample = ["--sample-request-env", "SAMPLE", "--sample-content-type", "application/json"]
    body = (mars["tmp"] / "sample.json").read_bytes()
    env = {**os.environ, "SAMPLE": base64.b64encode(body).decode()}
    found = _convert(mars["linear"], artefacts, *env_sample, env=env)
    own = _convert(mars["linear"], tmp_path / "pod-artefacts", *env_sample, env=env)
    assert found.returncode == 0, found.stderr[-3000:]
    assert "engine onnxruntime: found converted, matches eager" in found.stderr, found.stderr
    assert own.returncode == 0, own.stderr[-3000:]
    assert "engine onnxruntime: converted, matches eager" in own.stderr, own.stderr
    (record,) = [json.loads(line) for line in own.stdout.splitlines()]
    assert record["status"] == "ok" and Path(record["artefact"]["path"]).is_file()
    # the pod's own conversion sits under the key the profile's does
    key = Path(json.loads(found.stdout)["artefact"]["path"]).relative_to(artefacts)
    assert Path(record["artefact"]["path"]).relative_to(tmp_path / "pod-artefacts") == key


def test_a_mars_convert_without_its_sample_request_is_one_line(
    mars: dict[str, Path], tmp_path: Path
) -> None:
    done = _convert(mars["linear"], tmp_path / "artefacts")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "give --sample-request FILE" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def _predict(url: str, rows: list[list[float]]) -> list[tuple[int, Any]]:
    async with aiohttp.ClientSession() as s:

        async def one(row: list[float]) -> tuple[int, Any]:
            headers = {"Content-Type": "application/json"}
            async with s.post(url, data=json.dumps(row).encode(), headers=headers) as r:
                return r.status, json.loads(await r.text())

        return list(await asyncio.gather(*(one(row) for row in rows)))


def test_packrat_serve_answers_on_onnxruntime_as_eager(
    profiled: tuple[Path, Path, str], mars: dict[str, Path], tmp_path: Path
) -> None:
    _, artefacts, _ = profiled
    plan = {
        "cpus": 1,
        "batch": 2,
        "instances": [{"threads": 1, "batch": 2, "count": 1}],
        "engine": "onnxruntime",
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.0,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", str(mars["linear"])]
    cmd += ["--plan", str(tmp_path / "plan.json"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workdir", str(tmp_path / "work"), "--cpus", str(CPUS[0])]
    cmd += ["--runtime", "native", "--artefacts", str(artefacts)]
    url = f"http://127.0.0.1:{port}"
    proc = start_serving(["nice", "-n", "5", *cmd], url, tmp_path / "serve.log")
    rows = [[0.5] * 8, [float(i) - 3.5 for i in range(8)], [1.0, -2.0] * 4]
    try:
        answers = asyncio.run(_predict(f"{url}/predictions/linear", rows))
    finally:
        stop_serving(proc)
    text = (tmp_path / "work").rglob("*.log")
    worker_log = "\n".join(p.read_text(errors="replace") for p in text)
    assert "the handler's model runs on onnxruntime" in worker_log, worker_log[-3000:]
    assert "ran eager" not in worker_log  # every request on the engine
    torch.manual_seed(0)
    eager = torch.nn.Linear(8, 4).eval()
    with torch.inference_mode():
        want = eager(torch.tensor(rows)).tolist()
    assert [status for status, _ in answers] == [200] * len(rows), answers
    for (_, got), expected in zip(answers, want, strict=True):
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4


def test_a_handler_without_a_module_runs_eager_said_once(mars: dict[str, Path]) -> None:
    _need_onnxruntime()
    out = mars["tmp"] / "nomodule.json"
    done = _profile(mars["nomodule"], out, mars["tmp"] / "artefacts")
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "left out" in line]
    assert said == [
        "engines onnxruntime left out: handler nomodule_handler.py: the handler has no "
        "torch.nn.Module `model` attribute; the archive runs eager"
    ], done.stderr
    profile = load_profile(out)
    assert profile.engines == ["eager"]
    assert profile.meta.extra[ENGINES_KEY]["onnxruntime"]["status"] == "excluded"
