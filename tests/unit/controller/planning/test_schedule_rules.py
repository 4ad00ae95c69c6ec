"""The schedule of a model's passes (``planning/schedule.py``): its rules as properties."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from packrat.controller.core.context import Again, Result
from packrat.controller.core.model import model_spec
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning.schedule import (
    Before,
    Cadence,
    before_pass,
    next_delay,
    next_pass,
    pipeline_delay,
)

seconds = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
maybe = st.none() | seconds
cadences = st.builds(
    Cadence,
    resync_seconds=seconds,
    poll_seconds=seconds,
    estimate_seconds=seconds,
    storage_check_seconds=seconds,
)
agains = st.builds(Again, waiting=st.booleans(), within=maybe)
readings = st.sampled_from([None, ab.Reading((4, 4), "pods"), ab.Reading((4,), "service")])
befores = st.builds(
    Before,
    estimates=st.booleans(),
    tuning=maybe,
    auto=st.booleans(),
    checks_store=st.booleans(),
    fast_every=maybe,
)


@given(cadences, agains, st.booleans(), maybe, st.booleans())
def test_the_delay_is_the_earliest_reason(
    cadence: Cadence, again: Again, estimates: bool, tuning: float | None, store: bool
) -> None:
    delay = next_delay(cadence, again, wants_estimates=estimates, tuning=tuning, checks_store=store)
    reasons = [cadence.poll_seconds if again.waiting else cadence.resync_seconds]
    reasons += [cadence.estimate_seconds] if estimates else []
    reasons += [tuning] if tuning is not None else []
    reasons += [cadence.storage_check_seconds] if store else []
    reasons += [again.within] if again.within is not None else []
    assert delay == min(reasons)
    # one more reason never makes the next pass later
    sooner = next_delay(cadence, again.soon().within_seconds(1.0), wants_estimates=estimates)
    assert sooner <= min(cadence.poll_seconds, 1.0)


@given(cadences, befores, agains, readings)
def test_the_pods_are_read_between_passes_only_when_it_can_help(
    cadence: Cadence, before: Before, again: Again, reading: ab.Reading | None
) -> None:
    wait = next_pass(cadence, before, again, reading)
    if wait.peek_every is not None:
        assert wait.peek_every < wait.delay and wait.peek_every == before.fast_every
        assert before.auto and before.estimates and not again.waiting
        assert reading is not None and reading.source == "pods"


@given(st.lists(maybe, max_size=6), st.lists(st.booleans(), max_size=6))
def test_a_pass_asks_once_for_the_earliest_look(
    asks: list[float | None], progress: list[bool]
) -> None:
    result = Result()
    for seconds_ in asks:
        if seconds_ is not None:
            result.again_within(seconds_)
    for flag in progress:
        if flag:
            result.in_progress()
    wanted = [s for s in asks if s is not None]
    assert result.again == Again(waiting=any(progress), within=min(wanted, default=None))


SPEC: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}}
SLO = {"latencyP99Ms": 20, "rate": 2000, "durationSeconds": 4}


def test_reads_before_a_pass_follow_the_spec_and_the_stored_status() -> None:
    auto = model_spec({**SPEC, "autoBatch": {"min": 1, "max": 8}})
    ready = before_pass(auto, {"phase": "Ready"})
    assert ready.estimates and ready.auto and ready.fast_every == 1.0 and not ready.arrivals
    assert not before_pass(auto, {"phase": "Deploying"}).estimates
    for stage in ("rollout", "draining", "aborted"):
        assert not before_pass(auto, {"phase": "Ready", "switch": {"stage": stage}}).estimates
    tuned = model_spec({**SPEC, "slo": SLO, "autoscaling": {"intervalSeconds": 2}})
    assert before_pass(tuned, {}).tuning == 2.0
    assert before_pass(tuned, {"switch": {"stage": "rollout"}}).tuning is None
    default = model_spec({**SPEC, "slo": SLO, "autoscaling": {}})
    assert before_pass(default, {}).tuning == 5.0
    external = model_spec({**SPEC, "slo": SLO, "autoscaling": {"mode": "external"}})
    assert before_pass(external, {}).tuning is None
    assert before_pass(None, {"phase": "Ready"}) == Before()


@given(cadences, agains, st.booleans(), seconds)
def test_a_pipeline_is_measured_while_it_serves(
    cadence: Cadence, again: Again, serving: bool, measure: float
) -> None:
    delay = pipeline_delay(cadence, again, serving=serving, measure=measure)
    base = cadence.poll_seconds if again.waiting else cadence.resync_seconds
    assert delay == (min(base, measure) if serving else base)
