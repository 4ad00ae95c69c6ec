"""``plan.search.cheapest`` (both exhaustive references) against evaluating every candidate:
the same answer, and nothing costlier than the answer is evaluated."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.search import cheapest


@dataclass(frozen=True)
class Ev:
    index: int
    cost: int
    feasible: bool
    p99_ms: float


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.booleans(), st.sampled_from([1.0, 2.0, 3.0])),
        max_size=30,
    )
)
def test_cheapest_is_the_brute_force_minimum_and_evaluates_no_costlier_candidate(
    rows: list[tuple[int, bool, float]],
) -> None:
    evs = [Ev(i, cost, ok, p99) for i, (cost, ok, p99) in enumerate(rows)]
    seen: list[Ev] = []

    def evaluate(ev: Ev) -> Ev:
        seen.append(ev)
        return ev

    got = cheapest(((ev.cost, ev) for ev in evs), evaluate)
    brute: Ev | None = None
    for ev in evs:  # the exhaustive loops' old rule: strictly better (cost, P99) wins
        if ev.feasible and (brute is None or (ev.cost, ev.p99_ms) < (brute.cost, brute.p99_ms)):
            brute = ev
    assert got == brute
    if got is not None:
        assert all(ev.cost <= got.cost for ev in seen)
