"""The operator's metrics follow the metric contract: namespace and model on every series, base
units, ``_total`` counters, and a deleted model's series dropped."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from packrat.controller.core import metrics
from packrat.serve.dispatcher.metrics import ServeMetrics


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(registry).decode()
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _exercise(namespace: str, model: str) -> None:
    metrics.record_reconcile(namespace, model, "ok")
    metrics.record_error(namespace, model, "ApiException")
    metrics.record_event(namespace, model, "Warning", "SwitchAborted")
    metrics.record_phase(namespace, model, "Ready")
    metrics.record_profiling_progress(namespace, model, done=3, total=8, eta_seconds=12.5)
    metrics.record_profiling(namespace, model, 42.0)
    metrics.record_switch(namespace, model, "aborted")
    metrics.record_plan(namespace, model, expected_speedup=1.4, expected_latency_ms=250.0)
    metrics.record_cores_exclusive(namespace, model, False)
    metrics.publish_autobatch(
        namespace=namespace, model=model, observed_batch=4, decision="switch", switch_seconds=3.0
    )
    metrics.record_profiling_progress(namespace, model, done=1, total=8, eta_seconds=None)


def test_every_operator_series_names_its_model() -> None:
    _exercise("ns-a", "m1")
    samples = [s for s in _samples(metrics.REGISTRY) if s[0].startswith("packrat_")]
    assert samples
    for name, labels, _ in samples:
        assert labels.get("namespace") == "ns-a" and labels.get("model") == "m1", name
    names = {n for n, _, _ in samples}
    assert "packrat_operator_switches_total" in names
    assert "packrat_operator_switch_duration_seconds_count" in names
    assert "packrat_cores_exclusive" in names
    values = {(n, tuple(sorted(lb.items()))): v for n, lb, v in samples}
    key = ("packrat_model_expected_latency_seconds", (("model", "m1"), ("namespace", "ns-a")))
    assert values[key] == 0.25  # base units: seconds
    phases = {lb["phase"]: v for n, lb, v in samples if n == "packrat_model_phase"}
    assert phases["Ready"] == 1 and sum(phases.values()) == 1 and len(phases) > 3
    metrics.forget_model("ns-a", "m1")
    left = [s for s in _samples(metrics.REGISTRY) if s[1].get("model") == "m1"]
    assert left == []


def test_forget_model_keeps_other_models() -> None:
    _exercise("ns-a", "m1")
    _exercise("ns-b", "m1")
    metrics.forget_model("ns-a", "m1")
    left = {lb.get("namespace") for _, lb, _ in _samples(metrics.REGISTRY) if lb.get("model")}
    assert left == {"ns-b"}
    metrics.forget_model("ns-b", "m1")


def test_profiling_success_drops_the_progress_gauges() -> None:
    metrics.record_profiling_progress("ns", "p", done=2, total=4, eta_seconds=5)
    metrics.record_profiling("ns", "p", 10)
    names = {n for n, lb, _ in _samples(metrics.REGISTRY) if lb.get("model") == "p"}
    assert not {n for n in names if n.startswith("packrat_model_profiling_")}
    metrics.forget_model("ns", "p")


_CONVENTION = re.compile(r"^packrat_[a-z0-9_]+$")


@pytest.mark.parametrize("source", ["operator", "serve"])
def test_names_follow_prometheus_conventions(source: str) -> None:
    registry = metrics.REGISTRY if source == "operator" else ServeMetrics().registry
    for family in registry.collect():
        assert _CONVENTION.match(family.name), family.name
        if family.type == "counter":
            assert not family.name.endswith("_total")  # the client appends _total itself
        elif family.type == "gauge":
            assert not family.name.endswith(("_total", "_count", "_sum", "_bucket")), family.name
        assert not family.name.endswith(("_ms", "_milliseconds", "_minutes")), family.name


def test_serving_series_do_not_clash_with_target_labels() -> None:
    m = ServeMetrics()
    m.instance_up.labels("tiny", "tiny_i0").set(1)
    m.instance_requests.labels("tiny", "tiny_i0").inc()
    m.instance_restarts.labels("tiny", "tiny_i0").inc()
    reserved = {"instance", "job", "pod", "namespace", "container", "service", "endpoint"}
    for _, labels, _ in _samples(m.registry):
        assert not reserved & labels.keys(), labels
    assert any(lb.get("plan_instance") == "tiny_i0" for _, lb, _ in _samples(m.registry))
