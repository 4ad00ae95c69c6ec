"""Issue 26, LOW items at the serving pod: NaN and 1e999 inputs answer a clear 400 (the model
would answer them back, and bare NaN is not JSON), a body far larger than one sample is
refused before a worker parses it (a per-model cap), and requests the pod refuses or sheds
are not arrivals for the tuner (a flood must not buy its sender replicas)."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dispatcher_support import all_up, post, run, stack

from packrat.plan.optimizer import Plan
from packrat.serve.auth import TokenFile
from packrat.serve.codec import (
    MIN_BODY_CAP,
    CodecError,
    decode_sample,
    encode_output,
    input_body_cap,
)
from packrat.serve.pod.server import PodServer, ServeOptions

TINY = [{"dtype": "float32", "shape": [4]}]


@pytest.mark.parametrize(
    "body",
    [
        b"[1.0, NaN, 2.0, 3.0]",
        b"[1.0, Infinity, 2.0, 3.0]",
        b"[1.0, -Infinity, 2.0, 3.0]",
        b"[1e999, 0.0, 0.0, 0.0]",
        "[1.0, 1e999, 2.0, 3.0]",
        torch.tensor([1.0, math.nan, 2.0, 3.0]).numpy().tobytes(),  # raw bytes
    ],
)
def test_non_finite_inputs_are_a_clear_400(body: bytes | str) -> None:
    with pytest.raises(CodecError, match="finite"):
        decode_sample(body, TINY)
    assert len(decode_sample(b"[1, 2, 3, 4]", TINY)[0]) == 4


def test_a_non_finite_output_is_json_null() -> None:
    out = torch.tensor([[1.0, math.nan, math.inf], [0.5, 0.25, -math.inf]])
    assert json.loads(encode_output(out, 0)) == [1.0, None, None]
    assert json.loads(encode_output(out, 1)) == [0.5, 0.25, None]


def test_the_body_cap_follows_the_model_input() -> None:
    six_mib = 6 * 1024 * 1024
    assert input_body_cap(TINY, six_mib) == MIN_BODY_CAP
    resnet = [{"dtype": "float32", "shape": [3, 224, 224]}]
    assert input_body_cap(resnet, six_mib) == 8 * 3 * 224 * 224 * 4
    huge = [{"dtype": "float32", "shape": [3, 1024, 1024]}]
    assert input_body_cap(huge, six_mib) == six_mib
    assert input_body_cap([{"dtype": "qint8", "shape": [4]}], six_mib) == six_mib


def test_refused_and_shed_requests_are_not_arrivals() -> None:
    async def body() -> None:
        async with stack([1], max_body_bytes=1000, queue_limit=0) as (d, _fake, url, s):
            all_up(d)
            assert (await post(s, url, b"x" * 2000))[0] == 413
            async with s.post(f"{url}/predictions/other", data=b"x") as r:
                assert r.status == 404
            assert len(d.arrivals) == 0
            assert (await post(s, url))[0] == 200
            assert len(d.arrivals) == 1

    run(body)


def test_the_admin_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    """The admin token is a mounted file, not an environment variable, and a rotated Secret
    (the kubelet rewrites the file) reaches the running pod."""
    path = tmp_path / "token"
    path.write_text("first-token-0123456789\n")
    tokens = TokenFile(path)
    assert tokens() == "first-token-0123456789"
    fresh = tmp_path / "fresh"
    fresh.write_text("second-token-0123456789")
    os.replace(fresh, path)  # as the kubelet swaps a Secret volume's files
    assert tokens() == "second-token-0123456789"
    path.write_text("short")
    os.utime(path, (1, 1))
    assert tokens() is None  # too short: no token, every request 401
    path.unlink()
    assert tokens() is None


def test_an_instance_down_too_long_fails_liveness(tmp_path: Path) -> None:
    """A worker that crash-loops after serving (a truncated weight file) keeps its instance
    down; past ``stuck_instance_s`` /healthz fails, so the kubelet replaces the pod."""
    plan = Plan.from_dict(
        {
            "cpus": 1,
            "batch": 1,
            "instances": [{"threads": 1, "batch": 1, "count": 1}],
            "expected_latency_ms": 1.0,
        }
    )

    async def body() -> None:
        opts = ServeOptions(
            model="tiny", plan=plan, cpus=[0], stuck_instance_s=60.0, workdir=tmp_path
        )
        pod = PodServer(opts)
        pod.runtime = SimpleNamespace(running=True)  # type: ignore[assignment]
        now = asyncio.get_running_loop().time()
        (health,) = pod.health.values()
        health.up = True
        health.note(now)
        assert pod._alive()
        health.up = False  # its worker restarts, and never comes back
        health.note(now - 30)
        health.note(now)  # still down: the first time it went down counts
        assert pod._alive()
        health.down_since = now - 61
        assert not pod._alive()
        health.up = True
        health.note(now)
        assert pod._alive()

    run(body)
