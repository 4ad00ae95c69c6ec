"""Issue 38: the operator's canary rollback counts every answer the stable pods could not use
(a 4xx, a 503 shed) as a failure, and a canary pass never holds its reconcile thread for the
pods' sake: a fan-out still outstanding after a short wait is picked up by a later pass."""

from __future__ import annotations

import json
from collections.abc import Iterator

import http_support
import pytest

from packrat.controller.core.fanout import Answer, PodFanout
from packrat.controller.core.options.canary import canary_settings
from packrat.controller.switch.canary import CanaryClient, aggregate, crossed

URL = "http://m-canary.ns.svc:8080/predictions/m"


def _report(**counts: int) -> Answer:
    doc = {"canary": {"url": URL, "id": "v2", "p99Ms": 1.0, **counts}}
    return Answer(200, json.dumps(doc).encode())


@pytest.mark.parametrize(
    "counts",
    [
        {"served": 80, "client_errors": 20},  # a canary answering 400 to a fifth
        {"served": 80, "shed": 20},  # a canary shedding a fifth
        {"served": 0, "client_errors": 100},  # 400 to everything
    ],
)
def test_4xx_and_503_count_toward_rollback(counts: dict[str, int]) -> None:
    seen = aggregate([_report(**counts)], url=URL, ident="v2")
    assert seen.requests == 100 and seen.errors == 100 - counts["served"]
    settings = canary_settings(
        {
            "canary": {
                "model": {"zoo": "tiny"},
                "trafficPercent": 20,
                "rollback": {"maxErrorRate": 0.05},
            }
        }
    )
    assert settings is not None
    assert "error rate" in str(crossed(settings, seen))


@pytest.fixture()
def blackhole() -> Iterator[str]:
    """A pod that accepts connections and never answers."""
    with http_support.blackhole(backlog=64) as url:
        yield url


def test_a_blackholed_pass_does_not_wait_for_the_pods(blackhole: str) -> None:
    fanout = PodFanout()
    try:
        client = CanaryClient("http://{ip}:8080", "http://{service}", fanout=fanout)
        urls = [blackhole, blackhole]
        told = client.configure(
            urls, target=URL, percent=10, ident="v2", token="t" * 24, owner="ns/m"
        )
        assert told is None  # outstanding: a later pass picks its answers up
        assert client.stats(urls, owner="ns/m") is None
    finally:
        fanout.close()
