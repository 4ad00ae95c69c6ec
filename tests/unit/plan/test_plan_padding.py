"""Monotone plans (issue 37 item 7): a batch B runs on the best plan for any B' >= B, slots
left idle. Checked against an independent brute force of that padded problem, on random
profiles (hypothesis) and on the 8 published profiles, where latency must never fall as B
grows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.optimizer import MAX_PLAN_BATCH, Optimizer, Plan, PlanError
from packrat.plan.padding import PaddedPlans, padded_plan, padding_horizon
from packrat.plan.profile import load_profile
from packrat.plan.reconfig import plan_latency_at

PAPER = Path(__file__).resolve().parents[3] / "benchmarks" / "profiles" / "packrat-paper"
Table = dict[tuple[int, int], float]


def brute_force_padded(table: Table, cpus: int, batch: int, horizon: int) -> float | None:
    """The lowest max latency of any multiset of profiled pairs with sum t <= cpus and
    batch <= sum b <= horizon, by plain recursion (nothing shared with the optimizer)."""
    items = sorted(table)
    best: list[float | None] = [None]

    def rec(start: int, cores: int, held: int, worst: float) -> None:
        if held >= batch and (best[0] is None or worst < best[0]):
            best[0] = worst
        for i in range(start, len(items)):
            t, b = items[i]
            if t <= cores and held + b <= horizon:
                rec(i, cores - t, held + b, max(worst, table[(t, b)]))

    rec(0, cpus, 0, 0.0)
    return best[0]


latencies = st.floats(min_value=0.5, max_value=1000.0, allow_nan=False, allow_infinity=False)


@st.composite
def tables(draw: st.DrawFn) -> Table:
    threads = draw(st.sets(st.integers(1, 5), min_size=1))
    batches = draw(st.sets(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=1, max_size=4))
    table: Table = {}
    for t in threads:
        for b in batches:
            if draw(st.booleans()) or not table:
                table[(t, b)] = draw(st.one_of(st.sampled_from([1.0, 2.0, 4.0]), latencies))
    return table


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(1, 6), st.integers(1, 20), st.integers(0, 12))
def test_matches_brute_force(table: Table, cpus: int, batch: int, extra: int) -> None:
    horizon = batch + extra
    opt = Optimizer(table, cpus=cpus, max_batch=horizon)
    plans = PaddedPlans(opt)
    expected = brute_force_padded(table, cpus, batch, horizon)
    if expected is None:
        assert not plans.feasible(batch)
        with pytest.raises(PlanError):
            plans.plan(batch)
        return
    plan = plans.plan(batch)
    pairs = plan.expand()
    assert all(p in table for p in pairs)
    assert sum(t for t, _ in pairs) <= cpus
    assert batch <= plan.capacity <= horizon and plan.batch == batch
    assert plan.expected_latency_ms == max(table[p] for p in pairs) == expected
    assert plans.latency(batch) == expected
    # padding only when it helps: the exact plan when it is as fast
    if opt.feasible(batch) and opt.latency(batch) == expected:
        assert plan == opt.plan(batch)
    else:
        assert plan.capacity > batch and plan.instances == opt.plan(plan.capacity).instances
    # the padded plan survives the trip to a pod and back
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).instances == plan.instances


@settings(max_examples=200, deadline=None)
@given(tables(), st.integers(1, 6), st.integers(2, 24))
def test_latency_never_falls_as_the_batch_grows(table: Table, cpus: int, top: int) -> None:
    plans = PaddedPlans(Optimizer(table, cpus=cpus, max_batch=top))
    served = [plans.latency(b) for b in range(1, top + 1) if plans.feasible(b)]
    assert served == sorted(served)
    # feasible batches form a prefix: what holds B' also holds anything smaller
    feasible = [plans.feasible(b) for b in range(1, top + 1)]
    assert feasible == sorted(feasible, reverse=True)


@pytest.mark.parametrize("path", sorted(PAPER.glob("*.csv")), ids=lambda p: p.stem)
def test_paper_profiles_are_monotone(path: Path) -> None:
    profile = load_profile(path)
    opt = Optimizer.for_profile(profile, cpus=16, max_batch=padding_horizon(128))
    plans = PaddedPlans(opt)
    served = [plans.latency(b) for b in range(1, 129)]
    assert served == sorted(served), path.name
    assert all(s <= opt.latency(b) for b, s in zip(range(1, 129), served, strict=True))
    # the exact plans are not: this is what padding fixes
    exact = [opt.latency(b) for b in range(1, 129)]
    assert exact != sorted(exact)


def test_the_issue_example_resnet50_b63() -> None:
    opt = Optimizer.for_profile(
        load_profile(PAPER / "resnet-pytorch.csv"), cpus=16, max_batch=padding_horizon(63)
    )
    assert round(opt.latency(63), 1) == 353.7 and round(opt.latency(64), 1) == 220.9
    plan = padded_plan(opt, 63)
    assert (plan.batch, plan.capacity, round(plan.expected_latency_ms, 1)) == (63, 64, 220.9)
    assert plan.to_dict()["capacity"] == 64
    fat = next(a for a in plan.alternatives if a.name == "fat")
    assert fat.instances[0].batch == 63 and plan.fat_latency_ms is None  # 63 not profiled


def test_horizon() -> None:
    assert padding_horizon(1) == 2 and padding_horizon(63) == 126
    assert padding_horizon(MAX_PLAN_BATCH) == MAX_PLAN_BATCH
    assert padding_horizon(MAX_PLAN_BATCH + 5) == MAX_PLAN_BATCH + 5  # never below the ask


def test_plan_files_with_padding_are_bounded() -> None:
    base = {"cpus": 4, "batch": 3, "expected_latency_ms": 1.0}
    ok = Plan.from_dict({**base, "instances": [{"threads": 1, "batch": 2, "count": 2}]})
    assert ok.capacity == 4 and ok.batch == 3
    with pytest.raises(PlanError, match="serve batch 2, expected 3"):
        Plan.from_dict({**base, "instances": [{"threads": 1, "batch": 2, "count": 1}]})
    with pytest.raises(PlanError, match="at most"):
        Plan.from_dict({**base, "instances": [{"threads": 1, "batch": 2048, "count": 1}]})


def test_keeping_a_padded_plan_costs_what_its_instances_run() -> None:
    """The autoBatch decision's cost of keeping a plan spreads requests over its capacity
    (as the dispatcher does), not over its batch."""
    table = {(1, 1): 5.0, (1, 2): 1.8, (1, 4): 3.5}
    plan = padded_plan(Optimizer(table, cpus=2, max_batch=4), 3)
    assert plan.capacity == 4 and plan.expected_latency_ms == 1.8
    assert plan_latency_at(plan, table, 3) == 1.8  # 2 + 1 requests: batches of 2 at most
    assert plan_latency_at(plan, table, 4) == 1.8
