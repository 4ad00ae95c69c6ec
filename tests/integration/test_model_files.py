"""Model files users have (issue 37 item 5): a plain ``torch.jit.save`` file with its inputs
declared as KServe/Triton give them, a ``.pt2`` whose inputs come from a sample v2 request,
and an ONNX file (inputs read from its graph, external data beside it) are each profiled by
``packrat profile`` and served by ``packrat serve`` (native runtime): the v2 metadata names
the declared inputs and a real v2 infer answers what the model computes locally. The ONNX file
is also profiled on the onnxruntime engine (checked against its reference, ONNX Runtime run
on the file) and served on that engine's plan, from the file itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from jsonhttp import http_json
from serve_support import start_serving, stop_serving

from packrat.plan.optimizer import Optimizer
from packrat.plan.padding import padded_plan
from packrat.plan.profile import load_profile
from packrat.runtime import zoo
from packrat.runtime.cpus import allowed_cpus
from packrat.serve.torchserve.process import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
CPUS = allowed_cpus()
ENGINE = {"onnx": "onnxruntime"}  # the engine each kind's plan runs (default: eager)
ROWS = [[0.1 * (i + j) for j in range(16)] for i in range(2)]


def _write(kind: str, folder: Path) -> tuple[Path, list[str]]:
    """The model file of ``kind`` and the ``--inputs`` it is given (none for ONNX)."""
    model = zoo.tiny()
    if kind == "torchscript":  # a plain file: no packrat.json inside
        path = folder / "plain.pt"
        torch.jit.save(torch.jit.script(model), str(path))  # type: ignore[no-untyped-call]
        return path, ["--inputs", '[{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]']
    if kind == "pt2":  # inputs from a sample v2 request, batch 3
        path = folder / "tiny.pt2"
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(model, (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(path))
        request = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [3, 16],
                               "data": [0.0] * 48}]}  # fmt: skip
        (folder / "request.json").write_text(json.dumps(request))
        return path, ["--inputs", f"@{folder / 'request.json'}"]
    import onnx

    path = folder / "tiny.onnx"
    torch.onnx.export(
        model, (torch.randn(2, 16),), str(path), input_names=["features"],
        output_names=["logits"], dynamic_axes={"features": {0: "b"}, "logits": {0: "b"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    graph = onnx.load(str(path))
    onnx.save_model(graph, str(path), save_as_external_data=True, location="tiny.data",
                    size_threshold=0)  # fmt: skip
    return path, []


def _http(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return http_json(url, body)


@pytest.mark.parametrize("kind", ["torchscript", "pt2", "onnx"])
def test_a_model_file_is_profiled_and_served_from_its_inputs(tmp_path: Path, kind: str) -> None:
    path, inputs = _write(kind, tmp_path)
    engine = ENGINE.get(kind, "eager")
    engines = ["--engines", ",".join(dict.fromkeys(["eager", engine]))]
    artefacts = ["--artefacts", str(tmp_path / "artefacts")]
    out = tmp_path / "profile.json"
    packrat = [sys.executable, "-m", "packrat"]
    profiled = subprocess.run(
        [
            *packrat,
            "profile",
            "--model",
            str(path),
            *inputs,
            "--cpus",
            "1",
            "--max-batch",
            "2",
            "--point-budget",
            "2",
            "--allow-contended",
            "--progress-records",
            "off",
            *engines,
            *artefacts,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    profile = load_profile(out)
    assert set(profile.batches) == {1, 2} and engine in profile.engines, profile.meta.extra
    table = profile.for_engine(engine).table()
    plan = padded_plan(Optimizer(table, cpus=1, max_batch=2, engine=engine), 2)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    proc = start_serving(
        [
            *packrat,
            "serve",
            "--model",
            str(path),
            *inputs,
            "--plan",
            str(tmp_path / "plan.json"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workdir",
            str(tmp_path / "work"),
            "--cpus",
            str(CPUS[0]),
            *artefacts,
        ],
        url,
        tmp_path / "serve.log",
    )
    try:
        name = path.stem
        code, meta = _http(f"{url}/v2/models/{name}")
        assert code == 200, meta
        assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
        body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 16],
                            "data": [x for row in ROWS for x in row]}]}  # fmt: skip
        code, answer = _http(f"{url}/v2/models/{name}/infer", body)
        assert code == 200, answer
        with torch.inference_mode():
            want = zoo.tiny()(torch.tensor(ROWS))
        got = torch.tensor(answer["outputs"][0]["data"]).reshape(want.shape)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        wrong = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 15],
                             "data": [0.0] * 15}]}  # fmt: skip
        assert _http(f"{url}/v2/models/{name}/infer", wrong)[0] == 400
    finally:
        assert stop_serving(proc) == 0, (tmp_path / "serve.log").read_text(errors="replace")


def test_a_model_file_without_known_inputs_is_one_line_before_any_worker(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(zoo.tiny()), str(path))  # type: ignore[no-untyped-call]
    (tmp_path / "plan.json").write_text(json.dumps({"instances": []}))
    for cmd in (
        ["profile", "--model", str(path), "--cpus", "1", "-o", str(tmp_path / "p.json")],
        [
            "serve",
            "--model",
            str(path),
            "--plan",
            str(tmp_path / "plan.json"),
            "--workdir",
            str(tmp_path / "work"),
        ],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "packrat", *cmd], capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "does not describe its inputs" in lines[0], done.stderr
        assert not (tmp_path / "work").exists()
