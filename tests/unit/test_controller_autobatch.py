"""autoBatch: when the operator re-plans for the observed batch size."""

from __future__ import annotations

from typing import Any

from packrat.controller.autobatch import clamp, decide, effective_latency, expected_gain, observe

AUTO: dict[str, Any] = {
    "min": 1,
    "max": 16,
    "sustainObservations": 3,
    "minIntervalSeconds": 60,
    "minGain": 0.05,
}
LATENCY = {1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5, 16: 8.5}


def test_clamp_and_observe_streak() -> None:
    assert clamp(64, lo=1, hi=16) == 16
    assert clamp(0, lo=1, hi=16) == 1
    seen: dict[str, Any] = {"current": 2}
    for expected in (1, 2, 3):
        seen = observe(seen, estimate=8, auto=AUTO, now="t")
        assert seen["streak"] == expected and seen["observed"] == 8
    seen = observe(seen, estimate=4, auto=AUTO, now="t2")
    assert seen["streak"] == 1 and seen["observedAt"] == "t2"


def test_gain_model() -> None:
    assert effective_latency(2.0, plan_batch=4, load_batch=8) == 4.0
    assert effective_latency(2.0, plan_batch=4, load_batch=2) == 2.0
    # load forms batches of 8 while the plan is for 2: four rounds of 1.5 vs one of 4.5
    assert (
        abs(
            expected_gain(current_batch=2, current_latency_ms=1.5, new_batch=8, new_latency_ms=4.5)
            - 0.25
        )
        < 1e-9
    )


def _decide(seen: dict[str, Any], since: float | None = 1000.0) -> int | None:
    return decide(batch_status=seen, auto=AUTO, seconds_since_switch=since, latency=LATENCY.get)


def test_decide_needs_sustained_estimate_interval_and_gain() -> None:
    assert _decide({"current": 2, "observed": 8, "streak": 3}) == 8
    assert _decide({"current": 2, "observed": 8, "streak": 2}) is None  # not sustained
    assert _decide({"current": 2, "observed": 8, "streak": 3}, since=10) is None  # too soon
    assert _decide({"current": 2, "observed": 8, "streak": 3}, since=None) == 8  # never switched
    assert _decide({"current": 8, "observed": 8, "streak": 9}) is None  # already there
    assert _decide({"current": 2, "observed": 3, "streak": 3}) is None  # unprofiled size
    # smaller observed batches: the smaller plan is faster, a gain
    assert _decide({"current": 8, "observed": 2, "streak": 3}) == 2
    strict = {**AUTO, "minGain": 0.9}
    assert (
        decide(
            batch_status={"current": 2, "observed": 8, "streak": 3},
            auto=strict,
            seconds_since_switch=None,
            latency=LATENCY.get,
        )
        is None
    )
