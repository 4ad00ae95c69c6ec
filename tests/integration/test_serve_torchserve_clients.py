"""TorchServe's clients on both runtimes (issue 37): ``curl -T`` (a PUT) and ``curl -F
data=@file`` (a multipart form) as TorchServe's README uses them, against a real pod serving a
user's ``.mar`` whose handler reports what it was handed: the same on the native runtime as on
real TorchServe (a form split into its fields, the file's bytes under ``data``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mar_support import archive
from serve_support import start_serving, stop_serving

from packrat.runtime.cpus import allowed_cpus
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
CPUS = allowed_cpus()
HANDLER = """
import json


class EchoHandler:
    def initialize(self, context):
        pass

    def handle(self, data, context):
        out = []
        for row in data:
            seen = {}
            for key, value in sorted(row.items()):
                if isinstance(value, (bytes, bytearray)):
                    seen[key] = ["bytes", len(value), bytes(value[:8]).hex()]
                else:
                    seen[key] = [type(value).__name__, value]
            out.append(json.dumps(seen))
        return out
"""


@pytest.fixture(scope="module", params=["native", "torchserve"])
def echo_pod(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp(f"echo-{request.param}")
    (tmp / "echo_handler.py").write_text(HANDLER)
    archive(tmp, "echo", tmp / "echo_handler.py")
    (tmp / "warm.txt").write_text("warm")
    plan = {"cpus": 1, "batch": 2, "instances": [{"threads": 1, "batch": 2, "count": 1}],
            "expected_latency_ms": 1.0, "fat_latency_ms": 1.0}  # fmt: skip
    (tmp / "plan.json").write_text(json.dumps(plan))
    (port,) = free_ports(1)
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", str(tmp / "echo.mar"),
           "--plan", str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port),
           "--workdir", str(tmp / "work"), "--runtime", request.param, "--cpus", str(CPUS[-1]),
           "--warmup-body", str(tmp / "warm.txt")]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = start_serving(cmd, url, log)
    yield url
    stop_serving(proc)


def curl(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    body, _, code = done.stdout.rpartition("\n")
    return int(code), body


@pytest.mark.skipif(not Path("/usr/bin/curl").exists(), reason="needs curl")
def test_curl_put_and_form_reach_the_handler_as_torchserve_hands_them(
    echo_pod: str, tmp_path: Path
) -> None:
    image = tmp_path / "img.jpg"
    image.write_bytes(b"\xff\xd8\xff\xe0\r\n--not-a-boundary\r\n" + bytes(range(256)))
    n = image.stat().st_size
    status, body = curl("-T", str(image), f"{echo_pod}/predictions/echo")
    assert status == 200, body
    assert json.loads(body) == {"body": ["bytes", n, "ffd8ffe00d0a2d2d"]}
    status, body = curl("-F", f"data=@{image}", "-F", "note=hi", f"{echo_pod}/predictions/echo")
    assert status == 200, body
    seen = json.loads(body)
    assert seen["data"] == ["bytes", n, "ffd8ffe00d0a2d2d"]
    assert set(seen) == {"data", "note"}
