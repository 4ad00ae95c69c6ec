"""autoBatch end to end: the real operator follows a load step with exactly one automatic switch
and no failed request.

The operator (kopf subprocess) runs against the kmock emulator; the test agent runs real
``packrat profile`` and ``packrat serve`` processes (tiny model) and publishes the serving pods,
so the operator reads every ready pod's ``/status`` estimate. Closed-loop load goes through the
Service proxy: one client (the load forms batches of 1, the plan's batch), then bursts of 64
concurrent requests from ``packrat loadgen`` subprocesses (the pods' estimates land at 16 or
more, above the range's maximum, 8, so the operator clamps to 8 before and after the switch).

Deterministic by design: the step is eight times the range's maximum and sustain (3 readings)
filters the ramp, so the operator switches once to a larger batch and then holds (the load
keeps forming that batch). No timing assertions; waits have generous timeouts.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent / "operator"))

from harness import BurstLoad, Load, OperatorCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NAME = "auto"
SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "autoBatch": {"min": 1, "max": 8, "sustainObservations": 3, "minIntervalSeconds": 0},
    "maxBatchDelayMs": 2,
    "profiling": {
        "maxBatch": 8,
        "threads": [1, 2],
        "precision": 0.2,
        "timeBudgetSeconds": 20,
        "backoffLimit": 0,
    },
    "switch": {"readyTimeoutSeconds": 90, "drainSeconds": 2},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorCluster]:
    cluster = OperatorCluster(tmp_path_factory.mktemp("autobatch"))
    try:
        yield cluster
    finally:
        print("\n--- operator log tail ---\n" + cluster.log_tail(30))
        if cluster.agent.errors:
            print("agent errors:", cluster.agent.errors[-5:])
        cluster.close()


def _metric(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples whose labels include ``labels`` (0 when absent)."""
    wanted = dict(kv.split("=", 1) for kv in labels.split(",")) if labels else {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(
                sample.labels.get(k) == v.strip('"') for k, v in wanted.items()
            ):
                total += sample.value
    return total


def test_operator_follows_a_load_step_with_one_switch_and_no_failures(
    cluster: OperatorCluster,
) -> None:
    cluster.api.create(
        "packratmodels",
        {
            "apiVersion": "packrat.dev/v1alpha1",
            "kind": "PackratModel",
            "metadata": {"name": NAME},
            "spec": SPEC,
        },
    )
    wait_for(
        lambda: cluster.status(NAME).get("phase") == "Ready",
        timeout=90,
        what=f"{NAME} Ready (log: {cluster.log_tail(5)})",
        period=0.25,
    )
    status = cluster.status(NAME)
    assert status["batchSize"]["current"] == 1 and status["plan"]["batch"] == 1  # autoBatch.min

    # the operator finds the serving pod itself (not only the Service) and reads its estimate
    low_start = time.monotonic()
    with Load(cluster, NAME, NAME, clients=1) as low:
        seen = wait_for(
            lambda: (
                (cluster.status(NAME).get("batchSize") or {}).get("lastDecision")
                and cluster.status(NAME)["batchSize"]
            ),
            timeout=30,
            what="a first autoBatch decision",
            period=0.25,
        )
        time.sleep(3)  # several observations at the low load
    assert seen["source"] == "pods" and len(seen["estimates"]) == 1
    status = cluster.status(NAME)
    assert "switch" not in status and not status.get("switchHistory")
    assert status["batchSize"]["current"] == 1

    # the step: closed-loop bursts of 64 concurrent requests, eight times the range's maximum
    with BurstLoad(cluster, NAME, NAME, burst=64) as high:
        wait_for(
            lambda: len(cluster.status(NAME).get("switchHistory") or []) >= 1,
            timeout=60,
            what=f"an automatic switch (status: {cluster.status(NAME).get('batchSize')})",
            period=0.25,
        )
        switched_at = time.monotonic()
        # keep the load on: it still forms the same batch, so the operator must hold there
        wait_for(
            lambda: (
                time.monotonic() - switched_at > 5
                and (cluster.status(NAME)["batchSize"].get("lastDecision") or {}).get("time")
                > cluster.status(NAME)["switchHistory"][-1]["time"]
            ),
            timeout=30,
            what="decisions after the switch",
            period=0.25,
        )
    status = cluster.status(NAME)
    history = status["switchHistory"]
    assert len(history) == 1, history  # exactly one switch: no flapping
    (entry,) = history
    assert entry["result"] == "Succeeded"
    assert entry["fromBatch"] == 1 and entry["toBatch"] > 1, entry  # to a larger batch
    target = entry["toBatch"]
    assert status["batchSize"]["current"] == target and status["plan"]["batch"] == target
    assert "target" not in status["batchSize"] and "switch" not in status
    # after the switch the operator kept deciding, and held (no second switch)
    assert status["batchSize"]["lastDecision"]["outcome"].startswith("hold_")
    print("switch:", entry, "\nbatchSize:", status["batchSize"])
    assert status["activeSlot"] == "b"

    # zero failed requests across both phases and the switch
    assert low.results and high.records and not high.errors, high.errors[-1:]
    assert low.failures == [] and high.failures == [], (low.failures + high.failures)[:5]
    assert sum(1 for t, _, _ in high.records if t > switched_at) > 0  # served by the new plan
    assert min(t for t, _ in low.results) >= low_start

    # the events and metrics tell the same story
    changed = cluster.events("BatchSizeChanged")
    assert len(changed) == 1 and f"batch 1 -> {target}" in changed[0]["message"]
    text = cluster.operator.metrics()
    assert _metric(text, "packrat_operator_autobatch_decisions_total", 'outcome="switch"') == 1
    holds = sum(
        _metric(text, "packrat_operator_autobatch_decisions_total", f'outcome="{o}"')
        for o in ("hold_same", "hold_not_sustained", "hold_gain_too_small", "hold_too_soon")
    )
    assert holds > 0
    assert _metric(text, "packrat_operator_switch_duration_seconds_count", f'model="{NAME}"') == 1
    # (kmock leaves metadata.namespace unset on watch events, so the namespace label may be "")
    observed = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("packrat_model_observed_batch_size{") and f'model="{NAME}"' in line
    ]
    # the gauge is the last observation, the one in status (the load has stopped, so the pods'
    # estimates, and therefore the observations, no longer move)
    assert observed == [float(cluster.status(NAME)["batchSize"]["observed"])], observed
