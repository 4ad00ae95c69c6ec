"""Open Inference Protocol conformance: third-party clients against a real ``packrat serve`` pod
on both runtimes (native workers, real TorchServe), REST on its HTTP port and gRPC on its gRPC
port, answers compared with the tiny model run in process, error paths included.

Clients: tritonclient's gRPC client (dev extras), and the KServe SDK's REST and gRPC clients,
run as a subprocess from their own virtualenv (``make kserve-tools``: .venv/kserve, or
``$PACKRAT_KSERVE_PYTHON``); without it those tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_support import start_serving, stop_serving

from packrat.runtime import zoo
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
READY_S = 300
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CPUS = allowed_cpus()
BATCH = 4  # the plan's: two instances of batch 2


@dataclass
class OipPod:
    proc: subprocess.Popen[bytes]
    url: str
    grpc: str
    log: Path


@pytest.fixture(scope="module", params=["native", "torchserve"])
def pod(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[OipPod]:
    if len(CPUS) < 2:
        pytest.skip("needs a cpuset of at least 2 cpus")
    runtime = request.param
    tmp = tmp_path_factory.mktemp(f"oip-{runtime}")
    plan = {
        "cpus": 2,
        "batch": BATCH,
        "instances": [{"threads": 1, "batch": 2, "count": 2}],
        "expected_latency_ms": 1.0,
        "fat_latency_ms": 1.0,
    }
    (tmp / "plan.json").write_text(json.dumps(plan))
    port, grpc_port = free_ports(2)
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "packrat", "serve", "--model", "tiny",
           "--plan", str(tmp / "plan.json"), "--host", "127.0.0.1", "--port", str(port),
           "--grpc-port", str(grpc_port), "--workdir", str(tmp / "work"),
           "--runtime", runtime, "--cpus", f"{CPUS[0]},{CPUS[1]}"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = start_serving(cmd, url, log, ready_s=READY_S)
    yield OipPod(proc, url, f"127.0.0.1:{grpc_port}", log)
    assert stop_serving(proc) == 0, log.read_text(errors="replace")[-3000:]


def rows() -> tuple[np.ndarray, np.ndarray]:
    x = torch.randn(BATCH, 16, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = zoo.load_model("tiny")(x).numpy()
    return x.numpy(), expected


def test_tritonclient_grpc(pod: OipPod) -> None:
    client_mod = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (dev extras)")
    utils = pytest.importorskip("tritonclient.utils")
    client = client_mod.InferenceServerClient(pod.grpc)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny")
    assert client.get_server_metadata().name == "packrat"
    meta = client.get_model_metadata("tiny")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("input__0", "FP32", [-1, 16])
    ]
    x, expected = rows()
    tensor = client_mod.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny", [tensor], request_id="g1")
    assert result.get_response().id == "g1"
    np.testing.assert_allclose(result.as_numpy("output__0"), expected, atol=1e-5)
    for shape, code, text in (
        ([2, 15], "StatusCode.INVALID_ARGUMENT", "shape"),
        ([BATCH + 1, 16], "StatusCode.INVALID_ARGUMENT", f"1..{BATCH} samples"),
    ):
        wrong = client_mod.InferInput("input__0", shape, "FP32")
        wrong.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
        with pytest.raises(utils.InferenceServerException) as err:
            client.infer("tiny", [wrong])
        assert err.value.status() == code and text in str(err.value.message())
    with pytest.raises(utils.InferenceServerException) as err:
        client.get_model_metadata("other")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    client.close()


def kserve_python() -> str:
    python = os.environ.get("PACKRAT_KSERVE_PYTHON") or str(
        ROOT / ".venv" / "kserve" / "bin" / "python"
    )
    if not Path(python).exists():
        pytest.skip(f"the KServe SDK's virtualenv is missing ({python}): run make kserve-tools")
    return python


def test_kserve_sdk_rest_and_grpc(pod: OipPod) -> None:
    python = kserve_python()
    x, expected = rows()
    done = subprocess.run(
        [python, str(HERE / "kserve_driver.py"), pod.url, pod.grpc, "tiny", json.dumps(x.tolist())],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    for side in ("rest", "grpc"):
        seen = doc[side]
        assert seen["live"] and seen["ready"] and seen["model_ready"], seen
        for binary in (False, True):
            np.testing.assert_allclose(
                np.asarray(seen[f"infer_binary_{binary}"]), expected, atol=1e-5
            )
    assert doc["rest"]["bad_shape"]["status"] == 400
    assert "shape" in doc["rest"]["bad_shape"]["text"]
    assert doc["grpc"]["bad_shape"]["code"] == "INVALID_ARGUMENT"
    assert doc["grpc"]["other_model"]["code"] == "NOT_FOUND"
    assert doc["grpc"]["id"] == "k1"


def test_tritonclient_http_surface_and_metadata_matches_infer(pod: OipPod) -> None:
    """Every v2 REST path tritonclient calls, errors parsed (not 'failed to parse'), gzip and
    deflate bodies, and metadata that says what infer returns (over REST and gRPC)."""
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (dev extras)")
    grpc_client = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc]")
    utils = pytest.importorskip("tritonclient.utils")
    client = http.InferenceServerClient(pod.url.removeprefix("http://"), network_timeout=60)
    x, expected = rows()
    results = []
    for compression in (None, "gzip", "deflate"):
        tensor = http.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=False)
        results.append(client.infer("tiny", [tensor], request_compression_algorithm=compression))
    for result in results:
        np.testing.assert_allclose(result.as_numpy("output__0"), expected, atol=1e-5)
    (out,) = client.get_model_metadata("tiny")["outputs"]
    got = results[0].get_output("output__0")
    assert out["datatype"] == got["datatype"] == "FP32"
    assert out["shape"][1:] == got["shape"][1:] and out["shape"][0] == -1
    (gout,) = grpc_client.InferenceServerClient(pod.grpc).get_model_metadata("tiny").outputs
    assert (gout.datatype, list(gout.shape)) == (out["datatype"], out["shape"])
    assert client.get_model_config("tiny")["max_batch_size"] == BATCH
    (stats,) = client.get_inference_statistics("tiny")["model_stats"]
    assert stats["inference_stats"]["success"]["count"] >= 3
    assert client.get_model_repository_index() == [
        {"name": "tiny", "version": "1", "state": "READY"}
    ]
    for call in (
        lambda: client.get_model_metadata("other"),
        lambda: client.get_model_config("other"),
        lambda: client.get_inference_statistics("other"),
    ):
        with pytest.raises(utils.InferenceServerException) as err:
            call()
        assert err.value.status() == "404" and "other" in str(err.value.message())
    wanted = [http.InferRequestedOutput("output__0", class_count=2)]
    tensor = http.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(utils.InferenceServerException) as err:
        client.infer("tiny", [tensor], outputs=wanted)
    assert err.value.status() == "400" and "classification" in str(err.value.message())
    client.close()
