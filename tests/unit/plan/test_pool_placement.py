"""Pool placement against an independent brute force (every assignment, every model left out
or on some pod), and the reasons given when a model does not fit."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.pool.placement import (
    GIB,
    ModelDemand,
    PlacementError,
    PodCapacity,
    load_of,
    place,
)


def brute_force(
    models: list[ModelDemand],
    pods: list[PodCapacity],
    previous: dict[str, str],
    cap: float,
) -> tuple[int, float, int]:
    """The best (-placed, load, moves) over all (len(pods)+1)^n assignments."""
    best: tuple[int, float, int] | None = None
    for choice in itertools.product([None, *pods], repeat=len(models)):
        cores = {p.name: 0.0 for p in pods}
        ok = True
        assignment = {}
        for m, pod in zip(models, choice, strict=True):
            if pod is None:
                continue
            if m.weight_bytes > pod.budget_bytes:
                ok = False
                break
            cores[pod.name] += m.cores
            assignment[m.name] = pod.name
        if not ok or any(cores[p.name] > cap * p.cores + 1e-9 for p in pods):
            continue
        moves = sum(1 for n, p in assignment.items() if n in previous and previous[n] != p)
        key = (-len(assignment), round(load_of(assignment, models, pods), 9), moves)
        if best is None or key < best:
            best = key
    assert best is not None  # the empty assignment is always feasible
    return best


def _feasible(placement_assignment, models, pods, cap):  # type: ignore[no-untyped-def]
    by_pod = {p.name: p for p in pods}
    cores = {p.name: 0.0 for p in pods}
    for m in models:
        pod = placement_assignment.get(m.name)
        if pod is None:
            continue
        assert m.weight_bytes <= by_pod[pod].budget_bytes
        cores[pod] += m.cores
    for p in pods:
        assert cores[p.name] <= cap * p.cores + 1e-9


model_st = st.builds(
    ModelDemand,
    name=st.just(""),
    weight_bytes=st.integers(0, 8),
    rate=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]),
    service_s=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
)
pod_st = st.builds(
    PodCapacity,
    name=st.just(""),
    budget_bytes=st.integers(1, 10),
    cores=st.sampled_from([0.5, 1.0, 2.0]),
)


def _named(models: list[ModelDemand], pods: list[PodCapacity]):  # type: ignore[no-untyped-def]
    ms = [ModelDemand(f"m{i}", m.weight_bytes, m.rate, m.service_s) for i, m in enumerate(models)]
    ps = [PodCapacity(f"p{i}", p.budget_bytes, p.cores) for i, p in enumerate(pods)]
    return ms, ps


@settings(max_examples=150, deadline=None)
@given(
    st.lists(model_st, min_size=0, max_size=5),
    st.lists(pod_st, min_size=1, max_size=3),
    st.lists(st.integers(0, 3), min_size=5, max_size=5),
    st.sampled_from([0.5, 0.8, 1.0]),
)
def test_exact_search_matches_brute_force(models, pods, prev, cap):  # type: ignore[no-untyped-def]
    ms, ps = _named(models, pods)
    previous = {m.name: f"p{prev[i]}" for i, m in enumerate(ms)}
    got = place(ms, ps, previous=previous, max_utilisation=cap)
    _feasible(got.assignment, ms, ps, cap)
    key = (-len(got.assignment), round(got.load, 9), got.moves)
    assert key == brute_force(ms, ps, previous, cap)
    assert set(got.assignment) | set(got.unplaced) == {m.name for m in ms}
    assert not set(got.assignment) & set(got.unplaced)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(model_st, min_size=8, max_size=14),
    st.lists(pod_st, min_size=1, max_size=4),
)
def test_greedy_is_feasible_and_explains_every_left_out_model(models, pods):  # type: ignore[no-untyped-def]
    ms, ps = _named(models, pods)
    got = place(ms, ps)
    _feasible(got.assignment, ms, ps, 0.8)
    assert set(got.assignment) | set(got.unplaced) == {m.name for m in ms}
    assert all(reason for reason in got.unplaced.values())


def test_greedy_balances_equal_models_across_equal_pods() -> None:
    ms = [ModelDemand(f"m{i}", GIB, 1.0, 0.1) for i in range(12)]
    ps = [PodCapacity(f"p{i}", 2 * GIB, 4.0) for i in range(3)]
    got = place(ms, ps)
    counts = sorted(list(got.assignment.values()).count(p.name) for p in ps)
    assert counts == [4, 4, 4]
    assert got.load == pytest.approx(2.0)  # 4 GiB of weights on a 2 GiB budget: overcommitted


def test_a_model_keeps_its_pod_when_nothing_else_changes() -> None:
    ms = [ModelDemand(f"m{i}", GIB, 1.0, 0.1) for i in range(4)]
    ps = [PodCapacity("a", 4 * GIB, 2.0), PodCapacity("b", 4 * GIB, 2.0)]
    previous = {"m0": "a", "m1": "a", "m2": "b", "m3": "b"}
    got = place(ms, ps, previous=previous)
    assert got.assignment == previous and got.moves == 0
    # pod b goes away: its models move, a's stay
    gone = place(ms, ps[:1], previous=previous)
    assert gone.assignment == {"m0": "a", "m1": "a", "m2": "a", "m3": "a"}
    assert gone.moves == 2


def test_reasons_name_the_limit() -> None:
    ps = [PodCapacity("a", 2 * GIB, 2.0)]
    big = ModelDemand("big", 3 * GIB)
    busy = ModelDemand("busy", GIB, rate=100.0, service_s=0.1)
    got = place([big, busy], ps)
    assert "exceed the largest pod's weight budget" in got.unplaced["big"]
    assert "10.00 cores" in got.unplaced["busy"] and "1.60 usable cores" in got.unplaced["busy"]
    assert place([big], []).unplaced["big"] == "the pool has no pods"


@pytest.mark.parametrize(
    "models",
    [
        [ModelDemand("a", -1)],
        [ModelDemand("a", 1), ModelDemand("a", 2)],
        [ModelDemand("a", 1, rate=float("inf"), service_s=1.0)],
    ],
)
def test_malformed_input_is_refused(models: list[ModelDemand]) -> None:
    with pytest.raises(PlacementError):
        place(models, [PodCapacity("p", 1, 1.0)])
