"""autoBatch.rounding: how the serving pods round their batch-size estimate (issue 12, item 6)."""

from __future__ import annotations

from typing import Any

from packrat.controller.core.model import model_spec
from packrat.controller.core.spec import DEFAULT_ROUNDING, validate_spec
from packrat.controller.serving.manifests import serve_command
from packrat.plan.estimator import SERVING_ROUNDING
from packrat.serve.dispatcher.app import Dispatcher

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "profiling": {"maxBatch": 8}}


def test_the_operator_default_is_the_pods_default() -> None:
    assert DEFAULT_ROUNDING == SERVING_ROUNDING == "nearest"


def test_rounding_reaches_the_serving_command_only_when_not_the_default() -> None:
    auto = {**BASE, "autoBatch": {"min": 1, "max": 8}}
    nearest = {**BASE, "autoBatch": {"min": 1, "max": 8, "rounding": "nearest"}}
    floor = {**BASE, "autoBatch": {"min": 1, "max": 8, "rounding": "floor"}}
    assert "--batch-estimate" not in serve_command(model_spec(auto, name="m"))
    assert "--batch-estimate" not in serve_command(model_spec(nearest, name="m"))
    cmd = serve_command(model_spec(floor, name="m"))
    assert cmd[cmd.index("--batch-estimate") + 1] == "floor"
    plan = {"cpus": 2, "batch": 4, "instances": []}
    # the default leaves existing pods' hash alone (no switch on upgrade); floor rolls them
    assert model_spec(auto, image="i").serving_hash(plan) == model_spec(
        nearest, image="i"
    ).serving_hash(plan)
    assert model_spec(auto, image="i").serving_hash(plan) != model_spec(
        floor, image="i"
    ).serving_hash(plan)
    assert validate_spec(floor) == []
    bad = {**BASE, "autoBatch": {"min": 1, "max": 8, "rounding": "ceil"}}
    assert any("rounding" in e for e in validate_spec(bad))


def test_the_dispatcher_rounds_as_told() -> None:
    kwargs: dict[str, Any] = {"model": "m", "instances": [], "backend_url": "http://127.0.0.1:1"}
    assert Dispatcher(**kwargs).estimator.rounding == "nearest"
    assert Dispatcher(**kwargs, estimator_rounding="floor").estimator.rounding == "floor"
