"""The exact optimizer against an independent brute force, on random and published profiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging_support import ROOT

from packrat.plan.optimizer import Optimizer, Plan, PlanError, optimize
from packrat.plan.profile import load_profile

PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"
Table = dict[tuple[int, int], float]


def brute_force(table: Table, cpus: int, batch: int) -> tuple[float, int, int] | None:
    """Enumerate every multiset of profiled pairs with sum t <= cpus and sum b == batch.

    Returns the lexicographic minimum of (max latency, instances, threads), or None.
    Deliberately naive: recursion over items in a fixed order, no DP table shared with
    the optimizer.
    """
    items = sorted(table)

    best: list[tuple[float, int, int] | None] = [None]

    def rec(start: int, cores: int, rest: int, worst: float, count: int, threads: int) -> None:
        if rest == 0:
            cand = (worst, count, threads)
            if best[0] is None or cand < best[0]:
                best[0] = cand
            return
        for i in range(start, len(items)):
            t, b = items[i]
            if t <= cores and b <= rest:
                rec(i, cores - t, rest - b, max(worst, table[(t, b)]), count + 1, threads + t)

    rec(0, cpus, batch, 0.0, 0, 0)
    return best[0]


def check_plan(plan: Plan, table: Table, cpus: int, batch: int) -> tuple[float, int, int]:
    """The plan is valid: profiled pairs, fits the cores, serves exactly the batch."""
    pairs = plan.expand()
    assert all(p in table for p in pairs)
    assert sum(t for t, _ in pairs) <= cpus
    assert sum(b for _, b in pairs) == batch
    worst = max(table[p] for p in pairs)
    assert plan.expected_latency_ms == worst
    return (worst, len(pairs), sum(t for t, _ in pairs))


latencies = st.floats(min_value=0.5, max_value=1000.0, allow_nan=False, allow_infinity=False)


@st.composite
def random_tables(draw: st.DrawFn) -> tuple[Table, int]:
    max_t = draw(st.integers(min_value=1, max_value=6))
    threads = draw(st.sets(st.integers(1, max_t), min_size=1))
    batches = draw(st.sets(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=1, max_size=4))
    table: Table = {}
    for t in threads:
        for b in batches:
            if draw(st.booleans()) or len(table) == 0:
                # few distinct values so that ties (the tie-break rules) are exercised often
                table[(t, b)] = draw(st.one_of(st.sampled_from([1.0, 2.0, 4.0]), latencies))
    return table, max_t


@settings(max_examples=300, deadline=None)
@given(random_tables(), st.integers(1, 7), st.integers(1, 24))
def test_matches_brute_force_on_random_profiles(
    tb: tuple[Table, int], cpus: int, batch: int
) -> None:
    table, _ = tb
    expected = brute_force(table, cpus, batch)
    opt = Optimizer(table, cpus=cpus, max_batch=batch)
    if expected is None:
        assert not opt.feasible(batch)
        with pytest.raises(PlanError, match="no combination"):
            opt.plan(batch)
        return
    plan = opt.plan(batch)
    assert check_plan(plan, table, cpus, batch) == expected


@settings(max_examples=100, deadline=None)
@given(random_tables(), st.integers(1, 6))
def test_one_pass_answers_every_batch(tb: tuple[Table, int], cpus: int) -> None:
    """Every B up to the maximum from one DP equals a fresh solve of that B alone."""
    table, _ = tb
    opt = Optimizer(table, cpus=cpus, max_batch=16)
    for batch in range(1, 17):
        alone = Optimizer(table, cpus=cpus, max_batch=batch)
        assert opt.feasible(batch) == alone.feasible(batch)
        if opt.feasible(batch):
            assert opt.plan(batch).to_dict() == alone.plan(batch).to_dict()


def test_tie_break_prefers_fewer_instances_even_behind_a_slower_instance() -> None:
    # (1,4) costs 10 and sets the max; the rest (batch 2 on 3 cores) can be done by two
    # 1-thread instances at 5 ms or one 3-thread instance at 8 ms: both give max 10, so the
    # plan with fewer instances must win. A plain min-max DP with lexicographic tie-breaks
    # in its state keeps the 5 ms sub-plan and gets this wrong.
    table = {(1, 4): 10.0, (1, 1): 5.0, (3, 2): 8.0, (4, 4): 50.0}
    plan = optimize(table, cpus=4, batch=6)
    assert plan.expected_latency_ms == 10.0
    assert sorted(plan.expand()) == [(1, 4), (3, 2)]


def test_prefers_fewer_threads_among_equal_latency_and_count() -> None:
    table = {(1, 2): 3.0, (2, 2): 3.0, (4, 2): 3.0}
    plan = optimize(table, cpus=4, batch=2)
    assert plan.expand() == [(1, 2)]


def test_batch_need_not_be_a_power_of_two() -> None:
    table = {(1, 1): 1.0, (1, 2): 1.5, (1, 4): 2.5, (2, 4): 1.5}
    plan = optimize(table, cpus=3, batch=7)
    assert sum(b for _, b in plan.expand()) == 7


@pytest.mark.parametrize(
    ("cpus", "batch", "message"),
    [
        (0, 4, "cpus must be a positive integer"),
        (2, 0, "batch must be a positive integer"),
        (-1, 4, "cpus"),
        (2, -3, "batch"),
    ],
)
def test_invalid_requests_are_clear_errors(cpus: int, batch: int, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        optimize({(1, 1): 1.0}, cpus=cpus, batch=batch)


def test_infeasible_when_no_pair_fits() -> None:
    with pytest.raises(PlanError, match="no combination"):
        optimize({(4, 1): 1.0}, cpus=2, batch=1)
    with pytest.raises(PlanError, match="no combination"):
        optimize({(1, 2): 1.0}, cpus=8, batch=3)  # odd batch from even pieces
    with pytest.raises(PlanError, match="no combination"):
        optimize({(1, 1): 1.0}, cpus=2, batch=3)  # needs 3 instances, only 2 cores


def test_plan_round_trips_through_json_form() -> None:
    plan = optimize({(1, 1): 2.0, (2, 2): 3.0, (2, 1): 1.5}, cpus=2, batch=2)
    again = Plan.from_dict(plan.to_dict())
    assert again.to_dict() == plan.to_dict()
    assert plan.to_dict()["fat_latency_ms"] == 3.0
    assert plan.expected_speedup == pytest.approx(3.0 / plan.expected_latency_ms)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(cpus=1), "threads but only 1 cpus"),
        (lambda d: d.update(batch=5), "serve batch"),
        (lambda d: d.pop("instances"), "missing 'instances'"),
        (lambda d: d["instances"][0].update(threads=0), "threads must be an integer >= 1"),
    ],
)
def test_plan_from_dict_rejects_inconsistent_plans(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = optimize({(1, 1): 2.0, (1, 2): 3.0}, cpus=2, batch=2).to_dict()
    mutate(data)
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


# -- the paper's published profiles --------------------------------------------------------------

PAPER_FILES = sorted(PAPER.glob("*.csv"))


@pytest.fixture(scope="module", params=[p.name for p in PAPER_FILES] or ["missing"])
def paper_table(request: pytest.FixtureRequest) -> Table:
    assert PAPER_FILES, f"published profiles missing from {PAPER}"
    return load_profile(PAPER / request.param).table()


def test_paper_profiles_match_brute_force_small(paper_table: Table) -> None:
    """Full enumeration where it is affordable: T <= 4 and every B <= 32."""
    for cpus in range(1, 5):
        sub = {k: v for k, v in paper_table.items() if k[0] <= cpus}
        opt = Optimizer(paper_table, cpus=cpus, max_batch=32, alternatives=False)
        for batch in range(1, 33):
            expected = brute_force(sub, cpus, batch)
            if expected is None:  # e.g. batch 3 on one core: one power-of-two instance
                assert not opt.feasible(batch)
                continue
            assert check_plan(opt.plan(batch), paper_table, cpus, batch) == expected


def min_threads(table: Table, limit: float, batch_max: int) -> list[float]:
    """Independent certificate: the fewest threads that reach each batch using only pairs
    with latency <= limit (a 1-D unbounded knapsack, plain Python)."""
    best = [math.inf] * (batch_max + 1)
    best[0] = 0
    pairs = [(t, b) for (t, b), lat in table.items() if lat <= limit]
    for total in range(1, batch_max + 1):
        for t, b in pairs:
            if b <= total and best[total - b] + t < best[total]:
                best[total] = best[total - b] + t
    return best


@pytest.mark.parametrize("cpus", [3, 8, 13, 16])
def test_paper_profiles_optimal_latency_certified_up_to_1024(paper_table: Table, cpus: int) -> None:
    """For T in {3, 8, 13, 16} and every B <= 1024: the plan is valid, and no plan with a
    strictly lower latency exists (the fewest threads reaching B with faster pairs exceed T)."""
    max_b = 1024
    opt = Optimizer(paper_table, cpus=cpus, max_batch=max_b, alternatives=False)
    latencies = sorted({lat for (t, _), lat in paper_table.items() if t <= cpus})
    # the best latency at each level, found by sweeping levels with the certificate
    certified: dict[int, float] = {}
    for level in latencies:
        reach = min_threads({k: v for k, v in paper_table.items() if k[0] <= cpus}, level, max_b)
        for batch in range(1, max_b + 1):
            if batch not in certified and reach[batch] <= cpus:
                certified[batch] = level
        if len(certified) == max_b:
            break
    for batch in range(1, max_b + 1):
        assert opt.feasible(batch) == (batch in certified)
        if batch in certified:
            plan = opt.plan(batch)
            worst, _, _ = check_plan(plan, paper_table, cpus, batch)
            assert worst == certified[batch]


def test_paper_resnet_plan_beats_fat() -> None:
    assert PAPER_FILES, f"published profiles missing from {PAPER}"
    profile = load_profile(PAPER / "resnet-pytorch.csv")
    plan = Optimizer.for_profile(profile, cpus=16, max_batch=64).plan(64)
    assert plan.fat_latency_ms is not None
    assert plan.expected_speedup is not None and plan.expected_speedup > 1.5
    names = {a.name for a in plan.alternatives}
    assert names == {"fat", "per_core"}
