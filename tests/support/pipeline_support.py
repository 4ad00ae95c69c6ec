"""The pipeline tests' shared set-up: the two-stage pipeline ``chain`` and ``Cluster``, a fake
API with both reconcilers (the pipeline's and the stage models') and the controllers' part played
by hand. Tests take a fresh cluster as the ``cluster`` fixture
(tests/unit/controller/pipeline/conftest.py) or build one around another body."""

from __future__ import annotations

import copy
import datetime
from typing import Any

from kube_support import NS, T0, FakeKube, profile_json

from packrat.controller.core.context import Config
from packrat.controller.core.model import parse
from packrat.controller.core.status import get_condition
from packrat.controller.model.reconcile import Reconciler
from packrat.controller.pipeline.reconcile import PipelineReconciler
from packrat.controller.profiling.manifests import profile_configmap

NAME = "chain"
STAGE_MODEL: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "profiling": {"maxBatch": 8},
    "switch": {"readyTimeoutSeconds": 60, "drainSeconds": 0},
}
MODELS = ("chain-first", "chain-second")


def pipeline_body(**spec_changes: Any) -> dict[str, Any]:
    """The two-stage pipeline ``chain`` (first -> second), with ``spec_changes`` applied."""
    spec: dict[str, Any] = {
        "stages": [
            {"name": "first", "model": copy.deepcopy(STAGE_MODEL)},
            {"name": "second", "model": copy.deepcopy(STAGE_MODEL)},
        ],
        "edges": [{"from": "first", "to": "second", "fraction": 1.0}],
        "slo": {"latencyP99Ms": 200, "rate": 20, "cv": 1.0, "durationSeconds": 30},
    }
    spec.update(spec_changes)
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": NAME, "namespace": NS, "uid": "p1"},
        "spec": spec,
    }


class Cluster:
    """A fake API with both reconcilers and the controllers' part played by hand."""

    def __init__(self, body: dict[str, Any] | None = None, *, profile: str | None = None) -> None:
        self.profile = profile or profile_json()  # what every stage's profiling Job measures
        self.kube = FakeKube()
        config = Config(image="img")
        self.pipelines = PipelineReconciler(self.kube, config=config)
        self.models = Reconciler(self.kube, config=config)
        self.kube.create("packratpipelines", NS, body or pipeline_body())
        self.now = T0

    def obj(self, resource: str, name: str) -> dict[str, Any]:
        found = self.kube.get(resource, NS, name)
        assert found is not None, f"{resource}/{name} missing"
        return found

    def status(self) -> dict[str, Any]:
        return dict(self.obj("packratpipelines", NAME).get("status") or {})

    def step(self) -> None:
        """One round: the pipeline's pass, every stage model's, then the controllers."""
        self.now += datetime.timedelta(seconds=5)
        self.pipelines.reconcile(NS, NAME, now=self.now)
        for name in self.kube.of("packratmodels"):
            self.models.reconcile(NS, name, now=self.now)
            self.seed(name)
        for dep in self.kube.of("deployments"):
            self.kube.make_ready(dep)

    def seed(self, model: str) -> None:
        """What a finished profiling Job leaves: the profile ConfigMap under the model's key."""
        obj = self.obj("packratmodels", model)
        key = ((obj.get("status") or {}).get("profile") or {}).get("key")
        if key:
            assert parse(obj, default_image="img").profile_key == key
            cm = profile_configmap(
                parse(obj, default_image="img"), profile_json=self.profile, cpu_model="Test"
            )
            self.kube.create("configmaps", NS, cm)

    def settle(self, rounds: int = 12) -> dict[str, Any]:
        for _ in range(rounds):
            self.step()
            if self.status().get("phase") == "Serving":
                break
        return self.status()


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition ``type_`` of a pipeline status (empty when absent)."""
    return dict(get_condition(status.get("conditions"), type_) or {})
