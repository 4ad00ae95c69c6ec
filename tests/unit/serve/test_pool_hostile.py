"""The pool process against a hostile client (issue 38, the new surfaces): a v2 body is
capped at what the model's samples take as JSON and refused unbuffered beyond it, its declared
inputs are checked before any data is flattened, and it is parsed in the dispatcher's bounded
parse pool. Before, a 10 MB JSON body to one model was read and parsed whole on the event
loop (two such clients took another model's p50 from 6 ms to 1,275 ms) and only then
refused for its samples. Real pool (tiny PyTorch models), real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from packrat.controller.pool import manifests as pm
from packrat.serve.pool.app import build_app
from packrat.serve.pool.host import ConfigError, Pool, load_config, read_config


def infer_body(rows: int) -> bytes:
    tensor = {"name": "input__0", "datatype": "FP32", "shape": [rows, 16]}
    return json.dumps({"inputs": [{**tensor, "data": [0.123456789] * (rows * 16)}]}).encode()


async def answers(tmp: Path, bodies: list[tuple[str, bytes]]) -> list[tuple[int, Any]]:
    config = load_config(
        {"directory": str(tmp), "budget_bytes": 1 << 24,
         "models": [{"name": "a", "spec": "tiny", "seed": 1}]}
    )  # fmt: skip
    app = build_app(Pool(config))
    out = []
    async with TestClient(TestServer(app)) as client:
        for path, body in bodies:
            async with client.post(path, data=body) as r:
                out.append((r.status, await r.json()))
    return out


def test_a_v2_body_beyond_the_models_samples_is_refused_unbuffered(tmp_path: Path) -> None:
    got = asyncio.run(
        answers(
            tmp_path,
            [
                ("/v2/models/a/infer", infer_body(2)),
                ("/v2/models/a/infer", infer_body(1025)),  # declared beyond 1,024 samples
                ("/v2/models/a/infer", infer_body(50_000)),  # 10 MB
            ],
        )
    )
    assert got[0][0] == 200 and got[0][1]["outputs"][0]["shape"][0] == 2
    assert got[1][0] == 400 and "1..1024 samples" in got[1][1]["error"], got[1]
    assert got[2][0] == 413 and "at most" in got[2][1]["error"], got[2]


def test_a_model_name_cannot_write_into_the_metrics_or_paths() -> None:
    for name in ['a"} 1\npackrat_pool_budget_bytes{x="', "a b", "../a", ".hidden", ""]:
        doc = {
            "directory": "/nonexistent",
            "budget_bytes": 1,
            "models": [{"name": name, "spec": "tiny"}],
        }
        with pytest.raises(ConfigError):
            load_config(doc)
    assert (
        load_config(
            {
                "directory": "/x",
                "budget_bytes": 1,
                "models": [{"name": "bert-base_2.v1", "spec": "tiny"}],
            }
        )
        .models[0]
        .name
        == "bert-base_2.v1"
    )


def test_the_pod_reports_the_digest_of_the_config_file_it_serves(tmp_path: Path) -> None:
    """The operator moves a model's Service to a pool pod only when the pod reports the digest
    of the config written last; the digest is of the file's bytes, as the operator hashes the
    ConfigMap's text."""
    models = [{"name": "a", "spec": "tiny"}]
    text = json.dumps({"directory": "files", "budget_bytes": 1 << 20, "models": models}, indent=1)
    path = tmp_path / "pool.json"
    path.write_text(text)
    config = read_config(path)
    assert config.digest == hashlib.sha256(text.encode()).hexdigest()
    assert config.digest == pm.config_digest({"data": {pm.CONFIG_KEY: text}})
    path.write_text(text + " ")
    assert read_config(path).digest != config.digest


def test_a_predictions_body_beyond_one_sample_is_refused_unread(tmp_path: Path) -> None:
    """``POST /predictions/{model}`` is one sample: its body is capped at that sample's size as
    JSON (at least 64 KiB, as a serving pod caps it). Before, up to ``--max-body`` (16 MiB)
    went whole to the compute thread's JSON parser, which the other models wait for."""
    sample = json.dumps([0.5] * 16).encode()
    got = asyncio.run(
        answers(
            tmp_path,
            [
                ("/predictions/a", sample),
                ("/predictions/a", json.dumps([[0.5] * 16] * 20_000).encode()),  # 5 MB
                ("/predictions/a", sample),
            ],
        )
    )
    assert got[0][0] == 200 and got[2] == got[0]
    assert got[1][0] == 413 and "at most 65536 bytes" in got[1][1]["error"], got[1]
