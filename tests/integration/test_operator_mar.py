"""A user's .mar with a custom handler, profiled and served through the operator on the emulator.

Two archives built by torch-model-archiver around the same handler, one whose preprocess
sleeps 20 ms, are published by a plain HTTP server on loopback and named by
``spec.model.storageUri`` with their sha256 ``digest``: the profiling Job's init container
fetches and verifies each, the profile is measured through the handler with
``spec.model.sampleRequest``, and the served pods answer through the same handler. The
sleepy archive's profile must sit well above the plain one's (a sleep is a lower bound, so
the assertion is a behaviour, not a timing race); a wrong digest fails the profiling Job
with ``DigestMismatch`` in the ``Profiled`` condition and serves nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from harness import OperatorCluster, wait_for
from jsonhttp import http_json
from mar_support import build_mar
from models import FIRST_READY_S, body
from serve_support import file_server

from packrat.plan.profile import parse_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

SAMPLE = [0.5] * 8
SPEC: dict[str, Any] = {
    "cpus": 1,
    "batchSize": 1,
    "maxBatchDelayMs": 2,
    "profiling": {
        "maxBatch": 2,
        "threads": [1],
        "precision": 0.2,
        "timeBudgetSeconds": 60,
        "backoffLimit": 0,
    },
    "switch": {"readyTimeoutSeconds": 180, "drainSeconds": 1},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """(base URL, {archive: sha256 digest}) of a loopback HTTP server publishing the archives."""
    tmp = tmp_path_factory.mktemp("mar-store")
    digests = {}
    for name, sleep in (("plain", 0.0), ("sleepy", 0.02)):
        mar = build_mar(tmp, name, sleep)
        digests[name] = "sha256:" + hashlib.sha256(mar.read_bytes()).hexdigest()
    with file_server(tmp) as url:
        yield url, digests


def _spec(url: str, name: str, digest: str) -> dict[str, Any]:
    return {
        **SPEC,
        "model": {
            "storageUri": f"{url}/{name}.mar",
            "digest": digest,
            "format": "mar",
            "name": name,
            "sampleRequest": base64.b64encode(json.dumps(SAMPLE).encode()).decode(),
            "sampleContentType": "application/json",
        },
    }


def _profile(cluster: OperatorCluster, name: str) -> Any:
    cm_name = (cluster.status(name).get("profile") or {}).get("configMap")
    assert cm_name, cluster.status(name)
    cm = cluster.api.get("configmaps", cm_name)
    assert cm is not None
    return parse_profile(cm["data"]["profile.json"], origin=cm_name)


def _predict(cluster: OperatorCluster, service: str, model: str) -> tuple[int, Any]:
    return http_json(f"{cluster.agent.proxy.url(service)}/predictions/{model}", SAMPLE)


def test_a_mar_is_profiled_through_its_handler_and_served(
    cluster: OperatorCluster, store: tuple[str, dict[str, str]]
) -> None:
    url, digests = store
    for name in ("plain", "sleepy"):
        cluster.api.create("packratmodels", body(f"mar-{name}", _spec(url, name, digests[name])))
    for name in ("plain", "sleepy"):
        wait_for(
            lambda n=name: cluster.status(f"mar-{n}").get("phase") == "Ready",
            timeout=FIRST_READY_S * 2,
            what=f"mar-{name} Ready",
            period=0.5,
            detail=lambda n=name: f"status: {cluster.status(f'mar-{n}')}\n{cluster.log_tail(20)}",
        )
    profiles = {name: _profile(cluster, f"mar-{name}") for name in ("plain", "sleepy")}
    for profile in profiles.values():
        assert profile.meta.extra["through"] == "handler"
    for b in (1, 2):
        plain, sleepy = profiles["plain"].index[(1, b)], profiles["sleepy"].index[(1, b)]
        # the 20 ms sleep is inside every measured batch: well above noise, never below it
        assert sleepy.latency_ms >= 20.0, sleepy
        assert sleepy.latency_ms - plain.latency_ms > 10.0, (plain, sleepy)
    for name in ("plain", "sleepy"):
        wait_for(
            lambda n=name: _predict(cluster, f"mar-{n}", n)[0] == 200,
            timeout=180,
            what=f"mar-{name} answers",
            period=1.0,
        )
        code, answer = _predict(cluster, f"mar-{name}", name)
        assert code == 200 and isinstance(answer, list) and len(answer) == 4, answer
    for name in ("plain", "sleepy"):
        cluster.api.delete("packratmodels", f"mar-{name}")


def test_a_wrong_digest_fails_profiling_and_serves_nothing(
    cluster: OperatorCluster, store: tuple[str, dict[str, str]]
) -> None:
    url, digests = store
    name = "mar-tampered"
    cluster.api.create("packratmodels", body(name, _spec(url, "plain", digests["sleepy"])))
    wait_for(
        lambda: "DigestMismatch" in cluster.condition(name, "Profiled").get("message", ""),
        timeout=FIRST_READY_S,
        what="DigestMismatch in the Profiled condition",
        period=0.5,
        detail=lambda: f"status: {cluster.status(name)}\n{cluster.log_tail(20)}",
    )
    assert cluster.condition(name, "Profiled")["status"] == "False"
    assert cluster.api.get("deployments", f"{name}-a") is None
    assert not (cluster.status(name).get("profile") or {}).get("configMap")
    cluster.api.delete("packratmodels", name)
