"""Model files through the operator (issue 37 item 5), on the emulator: a plain
``torch.jit.save`` file with ``spec.model.inputs`` and an ONNX file (inputs from its graph),
published by a loopback HTTP server and named by ``spec.model.storageUri`` with their
digests, are profiled by the operator's Job and served: the v2 metadata names the declared
input and a v2 infer answers what the model computes. A declaration that cannot be used is
the ``InvalidSpec`` condition and a Warning event, and nothing is created for it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from harness import OperatorCluster, wait_for
from jsonhttp import http_json
from models import FIRST_READY_S, body, model_events
from serve_support import file_server

from packrat.runtime import zoo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

ROWS = [[0.05 * (i - j) for j in range(16)] for i in range(2)]
INPUTS = [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
SPEC: dict[str, Any] = {
    "cpus": 1,
    "batchSize": 2,
    "maxBatchDelayMs": 2,
    "profiling": {
        "maxBatch": 2,
        "threads": [1],
        "precision": 0.2,
        "timeBudgetSeconds": 120,
        "backoffLimit": 0,
        "allowContended": True,
    },
    "switch": {"readyTimeoutSeconds": 180, "drainSeconds": 1},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """(base URL, {file: sha256 digest}) of a loopback HTTP server publishing the files."""
    tmp = tmp_path_factory.mktemp("model-files")
    model = zoo.tiny()
    torch.jit.save(torch.jit.script(model), str(tmp / "plain.pt"))  # type: ignore[no-untyped-call]
    torch.onnx.export(
        model, (torch.randn(2, 16),), str(tmp / "tiny.onnx"), input_names=["features"],
        output_names=["logits"], dynamic_axes={"features": {0: "b"}, "logits": {0: "b"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    digests = {
        name: "sha256:" + hashlib.sha256((tmp / name).read_bytes()).hexdigest()
        for name in ("plain.pt", "tiny.onnx")
    }
    with file_server(tmp) as url:
        yield url, digests


def _spec(url: str, file: str, digest: str, fmt: str, **extra: Any) -> dict[str, Any]:
    model = {"storageUri": f"{url}/{file}", "digest": digest, "format": fmt, "name": "m"}
    return {**SPEC, "model": {**model, **extra}}


def _http(cluster: OperatorCluster, service: str, path: str, doc: Any = None) -> tuple[int, Any]:
    return http_json(f"{cluster.agent.proxy.url(service)}{path}", doc)


def test_a_torchscript_and_an_onnx_file_are_profiled_and_served(
    cluster: OperatorCluster, store: tuple[str, dict[str, str]]
) -> None:
    url, digests = store
    specs = {
        "plain-pt": _spec(url, "plain.pt", digests["plain.pt"], "torchscript", inputs=INPUTS),
        "tiny-onnx": _spec(url, "tiny.onnx", digests["tiny.onnx"], "onnx"),
    }
    for name, spec in specs.items():
        cluster.api.create("packratmodels", body(name, spec))
    with torch.inference_mode():
        want = zoo.tiny()(torch.tensor(ROWS))
    request = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 16],
                           "data": [x for row in ROWS for x in row]}]}  # fmt: skip
    for name in specs:
        wait_for(
            lambda n=name: cluster.status(n).get("phase") == "Ready",
            timeout=FIRST_READY_S * 2,
            what=f"{name} Ready",
            period=0.5,
            detail=lambda n=name: f"status: {cluster.status(n)}\n{cluster.log_tail(20)}",
        )
        wait_for(
            lambda n=name: _http(cluster, n, "/v2/models/m")[0] == 200,
            timeout=180,
            what=f"{name} metadata",
            period=1.0,
        )
        meta = _http(cluster, name, "/v2/models/m")[1]
        assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
        code, answer = _http(cluster, name, "/v2/models/m/infer", request)
        assert code == 200, answer
        got = torch.tensor(answer["outputs"][0]["data"]).reshape(want.shape)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for name in specs:
        cluster.api.delete("packratmodels", name)


def test_unusable_inputs_are_an_invalid_spec(
    cluster: OperatorCluster, store: tuple[str, dict[str, str]]
) -> None:
    url, digests = store
    bad = [{"name": "features", "datatype": "FP32", "shape": [16]}]  # no batch dimension
    name = "bad-inputs"
    spec = _spec(url, "plain.pt", digests["plain.pt"], "torchscript", inputs=bad)
    cluster.api.create("packratmodels", body(name, spec))
    wait_for(
        lambda: cluster.condition(name, "Ready").get("reason") == "InvalidSpec",
        timeout=FIRST_READY_S,
        what="InvalidSpec",
        period=0.5,
    )
    ready = cluster.condition(name, "Ready")
    assert "spec.model.inputs" in ready["message"] and "must start with -1" in ready["message"]
    uid = cluster.model(name)["metadata"]["uid"]
    assert [e for e in model_events(cluster, uid, "InvalidSpec") if e["type"] == "Warning"]
    assert cluster.api.list("jobs", {"app.kubernetes.io/instance": name}) == []
    cluster.api.delete("packratmodels", name)
