"""Helpers for the planners' tests (tests/unit/plan): the check every greedy-against-exhaustive
test makes of one small case, for the model's planner and the pipeline's alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def greedy_and_optimum(planner: Any, exhaustive: Callable[[Any], Any]) -> tuple[Any, Any] | None:
    """The greedy search's answer and the exhaustive optimum of ``planner``'s space, the
    greedy's answer checked feasible and inside the SLO; None where nothing is feasible
    (checked: the greedy finds nothing feasible either)."""
    best, _ = planner.greedy()
    optimum = exhaustive(planner)
    if optimum is None:
        assert not best.feasible
        return None
    assert best.feasible and best.p99_ms <= planner.slo_ms
    return best, optimum
