"""The template hash changes exactly when the rendered serving pod template does.

A hash that moves without the template (switch timings once did) starts a switch that
changes nothing; one that stays while the template moves leaves a slot serving an old
template. Both directions are checked on random pairs of specs against the real builder.
The plan is not in the template (the slot's plan ConfigMap holds it), only its cores are in
the template hash; the serving hash (``status.servingHash``) has the whole plan.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.controller.core.model import ModelSpec, model_spec
from packrat.controller.serving import manifests as m

PLANS = [
    {
        "cpus": 2,
        "batch": 2,
        "label": "2x1t/b1",
        "instances": [{"threads": 1, "batch": 1, "count": 2, "latency_ms": 1.0}],
    },
    {
        "cpus": 2,
        "batch": 4,
        "label": "1x2t/b4",
        "instances": [{"threads": 2, "batch": 4, "count": 1, "latency_ms": 2.0}],
    },
]

specs = st.fixed_dictionaries(
    {
        "model": st.sampled_from([{"zoo": "tiny"}, {"zoo": "resnet50"}]),
        "cpus": st.just(2),
        "batchSize": st.sampled_from([2, 4]),
        "replicas": st.integers(1, 3),
        "memory": st.sampled_from(["4Gi", "2Ti"]),
        "maxBatchDelayMs": st.sampled_from([2, 5]),
        "image": st.sampled_from(["img:1", "img:2"]),
        "nodeSelector": st.sampled_from([{}, {"pool": "cpu"}]),
        "runtime": st.sampled_from([None, "native", "torchserve"]),  # None: the pods' default
        "switch": st.fixed_dictionaries(
            {
                "readyTimeoutSeconds": st.sampled_from([8, 90, 300]),
                "drainSeconds": st.sampled_from([0, 2, 10]),
            }
        ),
    }
)


def _typed(spec: dict[str, Any]) -> ModelSpec:
    return model_spec(spec, name="f", namespace="ns", uid="u")


def _template(spec: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    dep = m.serving_deployment(_typed(spec), slot="a", serving_hash="-", replicas=1)
    template: dict[str, Any] = copy.deepcopy(dep["spec"]["template"])
    return template


@settings(max_examples=300, deadline=None)
@given(a=specs, b=specs, plan_a=st.sampled_from(PLANS), plan_b=st.sampled_from(PLANS))
def test_hash_moves_with_the_template_only(
    a: dict[str, Any], b: dict[str, Any], plan_a: dict[str, Any], plan_b: dict[str, Any]
) -> None:
    same_hash = _typed(a).template_hash(plan_a["cpus"]) == _typed(b).template_hash(plan_b["cpus"])
    same_template = _template(a, plan_a) == _template(b, plan_b)
    assert same_hash == same_template
    if plan_a != plan_b:  # the plan itself is in the serving hash only
        assert _typed(a).serving_hash(plan_a) != _typed(b).serving_hash(plan_b)


def test_a_plan_change_on_the_same_cores_keeps_the_template() -> None:
    spec = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
    assert _template(spec, PLANS[0]) == _template(spec, PLANS[1])
    assert _typed(spec).template_hash(2) != _typed(spec).template_hash(4)


def test_switch_timings_leave_template_and_hash() -> None:
    base = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
    other = {**base, "switch": {"readyTimeoutSeconds": 8, "drainSeconds": 600}}
    plan = PLANS[0]
    assert _template(base, plan) == _template(other, plan)
    assert _typed(base).serving_hash(plan) == _typed(other).serving_hash(plan)


def test_the_plan_crosses_the_status_edge_unchanged_and_hashes_as_before() -> None:
    """Every plan the optimizer makes reads back from status as it was stored (the
    alternatives the optimizer compared are not kept there), and its serving hash is the one
    computed from its status form (what operators before the typed plan hashed): an operator
    upgrade switches nothing."""
    from kube_support import profile_json

    from packrat.controller.core.plans import from_status, to_pod, to_status
    from packrat.plan.optimizer import Optimizer
    from packrat.plan.profile import parse_profile

    profile = parse_profile(profile_json(), origin="test")
    typed = _typed({"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2})
    for cpus, batch in ((1, 1), (2, 2), (2, 5), (2, 8)):
        plan = Optimizer.for_profile(profile, cpus=cpus, max_batch=8).plan(batch)
        stored = to_status(plan)
        back = from_status(stored)
        assert back is not None and to_status(back) == stored and to_pod(back) == to_pod(plan)
        assert typed.serving_hash(plan) == typed.serving_hash(to_pod(back))
    assert from_status({"cpus": 2, "batch": 1}) is None  # not a plan: none
    assert from_status(["x"]) is None


def test_the_runtime_reaches_the_pods_command_only_when_set() -> None:
    base: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}
    command = _template(base, PLANS[0])["spec"]["containers"][0]["command"]
    assert "--runtime" not in command  # the pods' default: no pod rolls on upgrade
    for runtime in ("native", "torchserve"):
        spec = {**base, "runtime": runtime}
        command = _template(spec, PLANS[0])["spec"]["containers"][0]["command"]
        assert command[command.index("--runtime") + 1] == runtime
        assert _typed(spec).serving_hash(PLANS[0]) != _typed(base).serving_hash(PLANS[0])
