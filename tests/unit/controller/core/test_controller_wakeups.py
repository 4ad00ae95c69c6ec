"""A watch reconnect re-lists every child; only news wakes a model."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.context import Again
from packrat.controller.core.wakeups import Wakeups
from packrat.controller.handlers import OperatorOptions
from packrat.controller.model.reconcile import Config
from packrat.controller.planning import schedule


def next_delay(
    options: OperatorOptions, *, waiting: bool = False, retry: float | None = None, **kw: Any
) -> float:
    """The schedule's delay for a pass that asked ``Again(waiting, retry)``."""
    return schedule.next_delay(options.cadence, Again(waiting=waiting, within=retry), **kw)


def _meta(uid: str, version: str) -> dict[str, str]:
    return {"uid": uid, "resourceVersion": version, "name": uid}


def test_unchanged_relisting_wakes_nobody() -> None:
    w = Wakeups()
    assert w.changed(_meta("d1", "5"), "ADDED")
    assert not w.changed(_meta("d1", "5"), None)  # re-listed after a reconnect, same version
    assert w.changed(_meta("d1", "6"), None)  # changed while the watch was down
    assert not w.changed(_meta("d1", "6"), None)
    assert w.changed(_meta("d2", "1"), None)  # new while the watch was down
    assert not w.changed(_meta("d1", "6"), "ADDED")  # a replaying watch, same version
    assert w.changed(_meta("d1", "6"), "MODIFIED")  # a modification always counts


def test_deleted_child_is_forgotten() -> None:
    w = Wakeups()
    w.changed(_meta("d1", "5"), "ADDED")
    assert w.changed(_meta("d1", "5"), "DELETED")
    assert w.changed(_meta("d1", "5"), None)  # recreated under the same uid: news again
    assert w.changed({"name": "no-version"}, None)  # nothing to compare: wake


def test_memory_is_bounded() -> None:
    w = Wakeups()
    w.MAX_SEEN = 3
    for i in range(10):
        w.changed(_meta(f"d{i}", "1"), "ADDED")
    assert len(w._seen) <= 3


def test_autobatch_model_at_rest_is_sampled_not_left_to_the_resync() -> None:
    opts = OperatorOptions(resync_seconds=300, poll_seconds=2, estimate_seconds=5)
    rest = {"waiting": False, "tuning": None}
    assert next_delay(opts, wants_estimates=False, **rest) == 300  # idle: the resync only
    assert next_delay(opts, wants_estimates=True, **rest) == 5  # autoBatch: an observation
    assert next_delay(opts, waiting=True, wants_estimates=True, tuning=None) == 2
    assert next_delay(opts, waiting=False, wants_estimates=True, tuning=1.5) == 1.5
    assert next_delay(opts, waiting=False, wants_estimates=False, tuning=30) == 30


def test_an_unobserved_generation_wakes_its_model_once() -> None:
    w = Wakeups()

    def body(generation: int, observed: int | None) -> dict[str, object]:
        status = {} if observed is None else {"observedGeneration": observed}
        return {"metadata": {"generation": generation}, "status": status}

    assert not w.unobserved("ns/m", body(1, 1))  # observed: nothing to do
    assert w.unobserved("ns/m", body(2, 1))  # a patch that kopf's diff did not see
    assert not w.unobserved("ns/m", body(2, 1))  # the operator's own status writes: once only
    assert w.unobserved("ns/m", body(3, 2))
    assert w.unobserved("ns/n", body(1, None))  # never observed
    w.drop("ns/m")
    assert w.unobserved("ns/m", body(3, 2))  # a new daemon for the model starts afresh


def test_a_storage_model_at_rest_asks_the_store_for_a_new_version() -> None:
    # a model replaced under the same URI sends no watch event: only the store check sees it
    opts = OperatorOptions(
        resync_seconds=300, poll_seconds=2, config=Config(storage_check_seconds=7)
    )
    rest = {"waiting": False, "wants_estimates": False, "tuning": None}
    assert next_delay(opts, checks_store=False, **rest) == 300
    assert next_delay(opts, checks_store=True, **rest) == 7


def test_the_pass_loop_retries_failures_and_ends_when_the_object_is_gone() -> None:
    import asyncio

    from packrat.controller.core.wakeups import run_passes

    outcomes: list[object] = [RuntimeError("api 500"), RuntimeError("api 500"), 0.0, None]
    errors: list[int] = []
    ran: list[object] = []

    async def one_pass() -> float | None:
        outcome = outcomes.pop(0)
        ran.append(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[return-value]

    async def main() -> None:
        await run_passes(
            False,
            asyncio.Event(),
            one_pass,
            backoff_s=0.001,
            on_error=lambda _exc, failures: errors.append(failures),
        )

    asyncio.run(main())
    assert errors == [1, 2]  # failures in a row, counted for the backoff
    assert len(ran) == 4 and outcomes == []  # a pass after each, then None ends the loop


def test_the_pass_loop_stops_when_kopf_says_so() -> None:
    import asyncio

    from packrat.controller.core.wakeups import run_passes

    async def one_pass() -> float | None:
        raise AssertionError("no pass once stopped")

    asyncio.run(run_passes(True, asyncio.Event(), one_pass, backoff_s=1, on_error=print))


def test_the_fast_trigger_reads_the_pods_every_sustain_seconds() -> None:
    from packrat.controller.core.model import ModelSpec, model_spec
    from packrat.controller.planning.schedule import fast_estimate_interval

    def model(**auto: object) -> ModelSpec:
        spec = {"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": {"min": 1, "max": 8, **auto}}
        return model_spec(spec)

    assert fast_estimate_interval(model()) == 1.0  # on by default: the paper's 1 s
    assert fast_estimate_interval(model(sustainSeconds=0)) is None  # off
    assert fast_estimate_interval(model(sustainSeconds=2)) == 2.0
    assert fast_estimate_interval(model(sustainSeconds=0.1)) == 0.5  # at least 0.5 s
    assert fast_estimate_interval(None) is None


def test_a_new_estimate_is_read_again_when_it_has_held_long_enough() -> None:
    """A pass that saw a new estimate held 0.3 of the 1 s the fast trigger wants looks again
    0.7 s (and a margin) later, not after the whole read interval; never in a tight loop."""
    from packrat.controller.planning.batching import FAST_DUE_FLOOR, FAST_DUE_MARGIN, due_delay

    options = OperatorOptions(resync_seconds=300, poll_seconds=2, estimate_seconds=5)
    at_rest: dict[str, Any] = {"waiting": False, "tuning": None}
    assert due_delay(0.7) == pytest.approx(0.7 + FAST_DUE_MARGIN)
    assert due_delay(0.0) == FAST_DUE_FLOOR
    due = next_delay(options, wants_estimates=True, retry=due_delay(0.7), **at_rest)
    assert due == pytest.approx(0.7 + FAST_DUE_MARGIN)
    assert next_delay(options, wants_estimates=True, retry=due_delay(9.0), **at_rest) == 5


def test_between_passes_the_pods_are_read_until_news_or_the_next_pass() -> None:
    """:func:`peek_until`: steady reads run until the pass's delay is (nearly) over; a new
    estimate or a watch event ends the wait at once; a timeouts wake waits for the fast
    trigger's minimum interval since the pass."""
    import asyncio

    from packrat.controller.planning import autobatch as ab
    from packrat.controller.planning.schedule import peek_until
    from packrat.plan.reconfig import FastPolicy

    basis = ab.Reading((4,), "pods", batches=(100, 0))
    eager = FastPolicy(sustain_s=1.0, min_interval_s=0.0, min_batches=20)

    def run(
        answers: list[ab.Reading | None],
        *,
        delay: float = 0.4,
        woken: bool = False,
        fast: FastPolicy = eager,
    ) -> tuple[float, int]:
        asked: list[int] = []

        async def peek() -> ab.Reading | None:
            asked.append(1)
            return answers[min(len(asked), len(answers)) - 1]

        async def main() -> float:
            wakeup = asyncio.Event()
            if woken:
                wakeup.set()
            return await peek_until(
                delay, every=0.05, basis=basis, fast=fast, wakeup=wakeup, peek=peek
            )

        return asyncio.run(main()), len(asked)

    left, reads = run([basis])  # steady: read until the pass is due, then what is left
    assert 0.0 <= left <= 0.05 and reads >= 1
    assert run([basis, ab.Reading((8,), "pods", batches=(101, 0))]) == (0.0, 2)  # news
    assert run([basis], woken=True) == (0.0, 0)  # a watch event: the pass runs now
    timeouts = ab.Reading((4,), "pods", batches=(100, 30))
    assert run([timeouts]) == (0.0, 1)  # frequent timeouts: a pass
    held = FastPolicy(sustain_s=1.0, min_interval_s=100.0, min_batches=20)
    left, reads = run([timeouts], fast=held)  # ... but not sooner than minIntervalSeconds
    assert 0.0 <= left <= 0.05 and reads >= 1


def test_the_pods_are_read_between_passes_only_when_it_can_help() -> None:
    from packrat.controller.core.model import model_spec
    from packrat.controller.planning import autobatch as ab
    from packrat.controller.planning.schedule import fast_estimate_interval, peek_interval

    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "autoBatch": {"min": 1, "max": 8}}
    fast = fast_estimate_interval(model_spec(spec))
    slow = fast_estimate_interval(model_spec({**spec, "autoBatch": {"sustainSeconds": 0}}))
    pods, service = ab.Reading((4, 4), "pods"), ab.Reading((4,), "service")
    assert peek_interval(fast, pods, waiting=False) == 1.0  # on by default, every second
    assert peek_interval(slow, pods, waiting=False) is None  # the fast trigger off
    assert peek_interval(fast, pods, waiting=True) is None  # a switch under way
    assert peek_interval(fast, service, waiting=False) is None  # no pods to read again
    assert peek_interval(fast, None, waiting=False) is None
