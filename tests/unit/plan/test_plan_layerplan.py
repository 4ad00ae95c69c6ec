"""The GPU per-layer plan against enumerating every placement, and its schedule against the
pipeline recurrence."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packrat.plan.gpu.layerplan import (
    Placement,
    StageProfile,
    best_placement,
    cold_latency,
    in_place_always,
    interleave,
    lcache_curve,
    schedule,
    simulate,
    warm_latency,
)
from packrat.plan.pool.lcache import pipeline_latency, plan_curves, sweet_spot

t = st.floats(0.0, 5.0, allow_nan=False)
stage_st = st.builds(
    lambda b, c, x, h: StageProfile("s", b, c, x, h),
    st.integers(0, 100),
    st.floats(0.01, 5.0),
    t,
    st.one_of(st.none(), t),
)


def brute(stages: list[StageProfile], prefix: int, fixed: frozenset[int] = frozenset()) -> float:
    def options(i: int, s: StageProfile) -> list[str]:
        if i in fixed:
            return ["host"]
        if i < prefix:
            return ["resident"]
        return ["load", "host"] if s.exec_host_s is not None else ["load"]

    choices = [options(i, s) for i, s in enumerate(stages)]
    return min(cold_latency(stages, list(p)) for p in itertools.product(*choices))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.lists(stage_st, min_size=1, max_size=7), st.data())
def test_best_placement_is_the_brute_force_optimum(
    stages: list[StageProfile], data: st.DataObject
) -> None:
    prefix = data.draw(st.integers(0, len(stages)))
    hostable = [i for i, s in enumerate(stages) if s.exec_host_s is not None]
    fixed = frozenset(
        data.draw(st.lists(st.sampled_from(hostable), max_size=2)) if hostable else []
    )
    plan = best_placement(stages, prefix, fixed_host=fixed)
    assert plan.latency_s == pytest.approx(brute(stages, prefix, fixed), abs=1e-9)
    assert plan.latency_s == pytest.approx(cold_latency(stages, plan.placements), abs=1e-9)
    assert all(p == "resident" for i, p in enumerate(plan.placements[:prefix]) if i not in fixed)
    assert "resident" not in plan.placements[prefix:]
    assert all(plan.placements[i] == "host" for i in fixed)


@settings(max_examples=150, deadline=None)
@given(st.lists(stage_st, min_size=1, max_size=7), st.floats(0.0, 0.2))
def test_in_place_always_stays_within_its_share_of_warm(
    stages: list[StageProfile], tolerance: float
) -> None:
    fixed = in_place_always(stages, tolerance)
    extra = sum(max((stages[i].exec_host_s or 0.0) - stages[i].exec_s, 0.0) for i in fixed)
    assert extra <= tolerance * warm_latency(stages) + 1e-12
    assert all(stages[i].exec_host_s is not None and stages[i].bytes > 0 for i in fixed)
    curve = lcache_curve("m", 1.0, stages, fixed_host=fixed)
    assert curve.bytes_[-1] == sum(s.bytes for i, s in enumerate(stages) if i not in fixed)
    # warm with the fixed stages in place costs at most the tolerance more than all resident
    assert curve.latency_s[-1] <= warm_latency(stages) * (1 + tolerance) + 1e-9


def test_an_embedding_is_read_in_place_and_blocks_are_loaded() -> None:
    # BERT-base-like: a 94 MB embedding whose lookup reads 128 rows; 12 blocks of 28 MB
    emb = StageProfile("embeddings", 94_000_000, 4.0e-3, 0.05e-3, 0.06e-3)
    blocks = [StageProfile(f"block{i}", 28_000_000, 1.2e-3, 0.4e-3, 10.0e-3) for i in range(12)]
    plan = best_placement([emb, *blocks])
    assert plan.placements[0] == "host"
    # and it stays on the host when the model is warm: 0.01 ms more than resident, 94 MB less
    assert in_place_always([emb, *blocks]) == {0}
    # copy-bound: the first block may run in place while the copy stream serves the others
    assert plan.placements[2:] == ("load",) * 11
    load_then_run = sum(s.copy_s for s in [emb, *blocks]) + warm_latency([emb, *blocks])
    assert plan.latency_s < 0.7 * load_then_run


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["resident", "load", "host"]), st.floats(0.01, 5), t),
        min_size=1,
        max_size=8,
    ),
    st.one_of(st.none(), st.integers(0, 4)),
)
def test_the_schedule_replays_the_pipeline_recurrence(
    ops: list[tuple[Placement, float, float]], lookahead: int | None
) -> None:
    placements = [p for p, _, _ in ops]
    copy = [c if p == "load" else 0.0 for p, c, _ in ops]
    run = [x for _, _, x in ops]
    sched = schedule(placements, lookahead=lookahead)
    assert simulate(sched, copy, run) == pytest.approx(
        pipeline_latency(copy, run, lookahead=lookahead)
    )
    # every loaded stage's run waits for its copy, and copies go in forward order
    copies = [op.stage for op in sched.copy if op.kind == "copy"]
    assert copies == [i for i, p in enumerate(placements) if p == "load"]
    for i in copies:
        k = sched.compute.index(
            next(op for op in sched.compute if op.kind == "run" and op.stage == i)
        )
        assert sched.compute[k - 1].kind == "wait" and sched.compute[k - 1].stage == i
    # the submission order: each stream's order kept, every wait after its signal
    order = interleave(sched)
    assert tuple(op for s, op in order if s == "copy") == sched.copy
    assert tuple(op for s, op in order if s == "compute") == sched.compute
    for k, (_, op) in enumerate(order):
        if op.kind == "wait":
            key = (op.event, op.stage)
            assert any(o.kind == "signal" and (o.event, o.stage) == key for _, o in order[:k])
    if "load" in placements and lookahead is None:
        first = schedule(placements, load_first=True)
        assert simulate(first, copy, run) == pytest.approx(sum(copy) + sum(run))


@settings(max_examples=100, deadline=None)
@given(st.lists(stage_st, min_size=1, max_size=5))
def test_the_lcache_curve_falls_to_warm(stages: list[StageProfile]) -> None:
    # physical profiles: reading in place is never faster than reading device memory
    assume(all(s.exec_host_s is None or s.exec_host_s >= s.exec_s for s in stages))
    curve = lcache_curve("m", 1.0, stages)
    assert curve.latency_s[-1] == pytest.approx(warm_latency(stages))
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(curve.latency_s))
    assert curve.bytes_[-1] == sum(s.bytes for s in stages)
    assert 0 <= sweet_spot(curve) <= len(stages)
    plan = plan_curves([curve], curve.bytes_[-1])
    assert plan.prefix["m"] == len(stages) or curve.latency_s[plan.prefix["m"]] == pytest.approx(
        curve.latency_s[-1]
    )


def test_bad_profiles_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="finite"):
        StageProfile("x", 1, -1.0, 0.0)
    with pytest.raises(ValueError, match="in place"):
        cold_latency([StageProfile("x", 1, 1.0, 1.0)], ["host"])
    with pytest.raises(ValueError, match="deadlocks"):
        from packrat.plan.gpu.layerplan import Op, Schedule

        simulate(Schedule((), (Op("wait", 0, "copied"), Op("run", 0)), ("load",)), [1.0], [1.0])
