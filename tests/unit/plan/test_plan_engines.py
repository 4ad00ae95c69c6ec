"""The engine as a dimension of the profile and the plan: best per engine, then best over
engines, checked against brute force; old profiles read as eager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.engines import EngineOptimizer, mixed_gain
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.profile import (
    Profile,
    ProfileError,
    ProfileMeta,
    ProfilePoint,
    load_profile,
    profile_from_dict,
)

Table = dict[tuple[int, int], float]
PAPER = Path(__file__).resolve().parents[3] / "benchmarks" / "profiles" / "packrat-paper"


def brute_force(table: Table, cpus: int, batch: int) -> tuple[float, int, int] | None:
    """Every multiset of pairs with sum t <= cpus and sum b == batch: the lexicographic
    minimum of (max latency, instances, threads). Naive on purpose."""
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


latencies = st.floats(min_value=0.5, max_value=100.0, allow_nan=False, allow_infinity=False)


@st.composite
def engine_tables(draw: st.DrawFn) -> dict[str, Table]:
    names = draw(
        st.lists(
            st.sampled_from(["eager", "openvino", "onnxruntime"]),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    out: dict[str, Table] = {}
    for name in names:
        threads = draw(st.sets(st.integers(1, 4), min_size=1))
        batches = draw(st.sets(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=3))
        table = {
            (t, b): draw(st.one_of(st.sampled_from([1.0, 2.0, 4.0]), latencies))
            for t in threads
            for b in batches
        }
        out[name] = table
    return out


@settings(max_examples=200, deadline=None)
@given(engine_tables(), st.integers(1, 5), st.integers(1, 12))
def test_best_over_engines_matches_brute_force(
    tables: dict[str, Table], cpus: int, batch: int
) -> None:
    opt = EngineOptimizer(tables, cpus=cpus, max_batch=batch)
    answers = {e: brute_force(t, cpus, batch) for e, t in tables.items()}
    feasible = {e: a for e, a in answers.items() if a is not None}
    if not feasible:
        assert not opt.feasible(batch)
        with pytest.raises(PlanError, match="no combination"):
            opt.plan(batch)
        return
    best = min(a for a in feasible.values())
    plan = opt.plan(batch)
    table = tables[plan.engine]
    pairs = plan.expand()
    # every instance runs the plan's engine, on pairs that engine profiled
    assert all(p in table for p in pairs)
    assert sum(t for t, _ in pairs) <= cpus and sum(b for _, b in pairs) == batch
    worst = max(table[p] for p in pairs)
    assert plan.expected_latency_ms == worst
    assert (worst, len(pairs), sum(t for t, _ in pairs)) == best
    assert answers[plan.engine] == best
    # fat: the fastest single instance of any engine
    fats = [t[(cpus, batch)] for t in tables.values() if (cpus, batch) in t]
    assert plan.fat_latency_ms == (min(fats) if fats else None)
    # a mix of engines is never slower on paper
    assert all(g >= 1.0 for g in mixed_gain(tables, cpus=cpus, max_batch=batch).values())


def _profile(points: list[ProfilePoint]) -> Profile:
    return Profile(meta=ProfileMeta(model="m", cpus=2), points=tuple(points))


def test_the_label_the_json_and_the_plan_file_say_the_engine() -> None:
    profile = _profile(
        [
            ProfilePoint(2, 8, 100.0),
            ProfilePoint(1, 4, 90.0),
            ProfilePoint(2, 8, 80.0, engine="openvino"),
            ProfilePoint(1, 4, 70.0, engine="openvino"),
        ]
    )
    opt = Optimizer.for_profile(profile, cpus=2, max_batch=8)
    plan = opt.plan(8)
    assert plan.engine == "openvino" and plan.label == "2x1t/b4 openvino"
    assert plan.fat_latency_ms == 80.0  # openvino's fat, the fastest fat engine
    names = {a.name: a.latency_ms for a in plan.alternatives}
    assert names["fat"] == 80.0 and names["best_eager"] == 90.0
    back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back.engine == "openvino" and back.label == plan.label
    # eager plans keep their old label, and a plan without an engine reads as eager
    eager = Optimizer.for_profile(profile.for_engine("eager"), cpus=2, max_batch=8).plan(8)
    assert eager.label == "2x1t/b4" and eager.engine == "eager"
    assert "engine" not in eager.to_dict()  # the old form: serving hashes unchanged
    assert Plan.from_dict(eager.to_dict()).engine == "eager"


def test_profiles_without_engines_read_as_eager_and_round_trip() -> None:
    old = {
        "format": "packrat.profile/v2",
        "meta": {"model": "m", "cpus": 2, "mode": "co-located"},
        "points": [{"threads": 1, "batch": 1, "latency_ms": 2.0}],
    }
    profile = profile_from_dict(old)
    assert profile.engines == ["eager"]
    assert "engine" not in profile.to_dict()["points"][0]  # eager files are unchanged
    both = _profile([ProfilePoint(1, 1, 2.0), ProfilePoint(1, 1, 1.0, engine="openvino")])
    again = profile_from_dict(json.loads(both.to_json()))
    assert again.engines == ["eager", "openvino"]
    assert again.latency(1, 1, "eager") == 2.0 and again.latency(1, 1) == 1.0
    assert again.table() == {(1, 1): 1.0}  # each pair's fastest engine
    with pytest.raises(ProfileError, match="no CSV form"):
        both.to_csv()
    with pytest.raises(ProfileError, match="duplicate"):
        _profile([ProfilePoint(1, 1, 2.0), ProfilePoint(1, 1, 1.0)])
    with pytest.raises(ProfileError, match="engine must be"):
        _profile([ProfilePoint(1, 1, 2.0, engine="Open VINO")])
    with pytest.raises(ProfileError, match="no points of engine 'inductor'"):
        both.for_engine("inductor")


@pytest.mark.skipif(
    not (PAPER / "resnet-pytorch.csv").is_file(), reason="the paper's profiles are not here"
)
def test_a_faster_engine_wins_every_batch_on_a_paper_profile() -> None:
    eager = load_profile(PAPER / "resnet-pytorch.csv").table()
    faster = {k: v / 1.4 for k, v in eager.items()}
    opt = EngineOptimizer({"eager": eager, "openvino": faster}, cpus=16, max_batch=64)
    plain = Optimizer(eager, cpus=16, max_batch=64)
    for b in range(1, 65):
        if opt.feasible(b):
            assert opt.plan(b).engine == "openvino"
            assert opt.latency(b) == pytest.approx(plain.latency(b) / 1.4)


def test_mixed_gain_shows_what_a_mix_would_win() -> None:
    # 3 cores, B = 4: eager is fastest on the 2-thread instance, openvino on the 1-thread one
    tables = {
        "eager": {(2, 3): 10.0, (1, 1): 30.0},
        "openvino": {(2, 3): 30.0, (1, 1): 10.0},
    }
    gain = mixed_gain(tables, cpus=3, max_batch=4)
    assert gain[4] == pytest.approx(3.0)  # eager 2t/b3 + openvino 1t/b1: 10 ms, not 30
    assert gain[1] == 1.0
