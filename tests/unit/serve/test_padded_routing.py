"""A padded plan on the serving side (issue 37 item 7): the dispatcher spreads a burst of B
requests over instances whose batches hold B' >= B; no instance gets more than its batch
(the plan's latency holds), every request is placed, and B' - B slots stay idle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.serve.dispatcher.routing import choose_instance, default_caps


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=16), st.data())
def test_a_burst_smaller_than_the_plan_fits_every_instance(
    batches: list[int], data: st.DataObject
) -> None:
    capacity = sum(batches)
    burst = data.draw(st.integers(1, capacity))
    outstanding = [0] * len(batches)
    caps = default_caps(batches)
    for _ in range(burst):
        i = choose_instance(outstanding, batches, caps=caps)
        assert i is not None
        outstanding[i] += 1
    assert sum(outstanding) == burst
    assert all(n <= b for n, b in zip(outstanding, batches, strict=True))
    assert capacity - burst == sum(b - n for n, b in zip(outstanding, batches, strict=True))


def test_resnet50_b63_on_the_plan_for_64() -> None:
    batches = [4] * 16  # 16x1t/b4, the plan for 64 that serves 63
    outstanding = [0] * 16
    for _ in range(63):
        i = choose_instance(outstanding, batches)
        assert i is not None
        outstanding[i] += 1
    assert sorted(outstanding) == [3] + [4] * 15


def test_the_pod_reads_a_padded_plan_as_the_operator_writes_it() -> None:
    """The slot's plan ConfigMap (``to_pod``) of a padded plan parses in the pod into one
    instance per slot of the larger batch, the served batch kept."""
    import json

    from packrat.controller.core.plans import from_status, layout, to_pod, to_status
    from packrat.plan.optimizer import Optimizer
    from packrat.plan.padding import padded_plan
    from packrat.serve.config import parse_plan, plan_instances

    table = {(1, 1): 5.0, (1, 2): 1.8, (2, 4): 3.5}
    plan = padded_plan(Optimizer(table, cpus=2, max_batch=4), 3)
    pod = parse_plan(json.dumps(to_pod(plan)), origin="test")
    assert (pod.batch, pod.capacity) == (3, 4)
    specs = plan_instances(pod, model="m", cores=[[0], [1]])
    assert [s.batch for s in specs] == [2, 2]
    back = from_status(to_status(plan))  # the status keeps it, too
    assert back is not None and layout(back) == layout(plan) and back.capacity == 4
    assert to_status(plan)["capacity"] == 4


def test_the_bench_runs_a_padded_plan_as_the_dispatcher_splits_it() -> None:
    """packrat bench (and the demo) measure a padded plan with the requests a burst of its
    batch gives each instance: an exact plan's instances their own batch, a padded one's
    fewer, an idle one left out."""
    from packrat.bench.microbench import burst_pairs
    from packrat.plan.optimizer import Optimizer
    from packrat.plan.padding import padded_plan

    table = {(1, 1): 5.0, (1, 2): 1.8, (1, 4): 3.0}
    opt = Optimizer(table, cpus=3, max_batch=8)
    exact = opt.plan(4)
    assert burst_pairs(exact) == tuple(exact.expand())
    plan = padded_plan(opt, 5)  # 5 exactly needs a (1, 1) at 5 ms; the plan for 6 is 3x b2
    assert plan.capacity == 6 and plan.expected_latency_ms == 1.8
    assert sorted(burst_pairs(plan)) == [(1, 1), (1, 2), (1, 2)]
