"""The chart's NetworkPolicies (issue 28 item 7), evaluated offline with Kubernetes' ingress
semantics (``allowed`` below: a pod selected by any policy accepts a connection only when one
of their ingress rules admits the source and the port) on the very pods the chart and the
operator build: the operator still reaches every serving pod and router on :8080 however the
clients are restricted, Prometheus scrapes, the Service's clients call, and nothing else gets in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from packaging_support import NAMESPACE, by_kind, helm_home, render_objects

pytest.importorskip("helm_python")

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
GATEWAY = {
    "namespaceSelector": {"matchLabels": {"team": "web"}},
    "podSelector": {"matchLabels": {"app": "gateway"}},
}


@pytest.fixture(scope="module", autouse=True)
def _helm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with helm_home(tmp_path_factory.mktemp("helm")):
        yield


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        have, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values", [])
        ok = {
            "In": have in values,
            "NotIn": have not in values,
            "Exists": have is not None,
            "DoesNotExist": have is None,
        }[op]
        if not ok:
            return False
    return True


def _peer_admits(peer: Mapping[str, Any], source: Pod, policy_ns: str) -> bool:
    if "ipBlock" in peer:
        return False  # the tests' sources are pods
    ns_ok = (
        _selects(peer["namespaceSelector"], source.ns_labels())
        if "namespaceSelector" in peer
        else source.namespace == policy_ns
    )
    pod_ok = _selects(peer["podSelector"], source.labels) if "podSelector" in peer else True
    return ns_ok and pod_ok


def _port_admits(rule_ports: list[dict[str, Any]] | None, dest: Pod, port: int) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        want = p.get("port")
        number = dest.ports.get(want) if isinstance(want, str) else want
        if want is None or number == port:
            return True
    return False


def allowed(policies: list[dict[str, Any]], source: Pod, dest: Pod, port: int) -> bool:
    """Does any policy let ``source`` open ``port`` on ``dest`` (ingress only)?"""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dest.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], dest.labels)
    ]
    if not selecting:
        return True  # not isolated
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            source_ok = peers is None or any(
                _peer_admits(peer, source, policy["metadata"]["namespace"]) for peer in peers
            )
            if source_ok and _port_admits(rule.get("ports"), dest, port):
                return True
    return False


def _operator_pod(objects: list[dict[str, Any]]) -> Pod:
    (deployment,) = by_kind(objects, "Deployment")
    template = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    return Pod(NAMESPACE, template["metadata"]["labels"], ports)


def _model_pods(namespace: str) -> dict[str, Pod]:
    """A serving pod, a pipeline router and a profiling pod as the operator builds them."""
    from packrat.controller.pipeline import manifests as pipeline_manifests
    from packrat.controller.serving import manifests

    owner = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "resnet50", "namespace": namespace, "uid": "u-1"},
        "spec": {"model": {"zoo": "resnet50"}, "cpus": 4, "batchSize": 8},
    }
    from packrat.controller.core.model import parse

    serving = manifests.serving_deployment(
        parse(owner), slot="a", serving_hash="h" * 16, replicas=1
    )
    pods = {"serving": serving["spec"]["template"]}
    router_labels = pipeline_manifests._labels("pipe")
    pods["router"] = {"metadata": {"labels": router_labels}, "spec": {"containers": []}}
    pods["profiling"] = {
        "metadata": {"labels": manifests.base_labels("resnet50", app=manifests.PROFILING_APP)},
        "spec": {"containers": []},
    }
    out = {}
    for name, template in pods.items():
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }
        out[name] = Pod(namespace, template["metadata"]["labels"], ports)
    return out


def test_on_by_default_without_breaking_the_default_install() -> None:
    objects = render_objects({})
    policies = by_kind(objects, "NetworkPolicy")
    assert [p["metadata"]["namespace"] for p in policies] == [NAMESPACE]  # the operator's only
    operator = _operator_pod(objects)
    anyone = Pod("elsewhere", {"app": "x"})
    for port in ("health", "metrics"):
        assert allowed(policies, anyone, operator, operator.ports[port])  # probes, Prometheus
    assert not allowed(policies, anyone, operator, 5000)
    # serving pods in some namespace: untouched (the chart cannot know every namespace)
    pods = _model_pods("models-x")
    assert allowed(policies, anyone, pods["serving"], 8080)
    assert by_kind(render_objects({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_model_namespaces_accept_8080_from_the_operator_and_clients() -> None:
    values = {"watchNamespaces": ["models-a", "models-b"]}
    objects = render_objects(values)
    policies = by_kind(objects, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == sorted(
        [NAMESPACE, "models-a", "models-b"]
    )
    operator = _operator_pod(objects)
    client = Pod("web", {"app": "frontend"})
    for namespace in ("models-a", "models-b"):
        pods = _model_pods(namespace)
        for kind in ("serving", "router"):
            assert allowed(policies, operator, pods[kind], 8080), kind
            assert allowed(policies, client, pods[kind], 8080), kind  # Service clients
            assert not allowed(policies, client, pods[kind], 7070), kind  # nothing else
        assert not allowed(policies, client, pods["profiling"], 8080 + 1)
    # a namespace neither watched nor listed is left alone
    assert allowed(policies, client, _model_pods("models-c")["serving"], 7070)


def test_restricted_clients_keep_the_operator_and_prometheus() -> None:
    values = {
        "networkPolicy": {
            "modelNamespaces": ["models-a"],
            "servingFrom": [GATEWAY],
            "metricsFrom": [MONITORING],
        }
    }
    objects = render_objects(values)
    policies = by_kind(objects, "NetworkPolicy")
    operator = _operator_pod(objects)
    serving = _model_pods("models-a")["serving"]
    gateway = Pod("web", {"app": "gateway"}, namespace_labels={"team": "web"})
    prometheus = Pod("monitoring", {"app": "prometheus"})
    stranger = Pod("web", {"app": "other"}, namespace_labels={"team": "web"})
    assert allowed(policies, operator, serving, 8080)  # plan posts, estimates: never cut off
    assert allowed(policies, gateway, serving, 8080)
    assert allowed(policies, prometheus, serving, 8080)
    assert not allowed(policies, stranger, serving, 8080)
    # the operator's metrics: Prometheus only; its health port: the kubelet, helm test
    assert allowed(policies, prometheus, operator, operator.ports["metrics"])
    assert not allowed(policies, stranger, operator, operator.ports["metrics"])
    assert allowed(policies, stranger, operator, operator.ports["health"])
    # the evaluator is not vacuous: an operator pod in another namespace is refused
    elsewhere = Pod("other-ns", operator.labels, operator.ports)
    assert not allowed(policies, elsewhere, serving, 8080)


def test_values_schema_rejects_a_bad_peer() -> None:
    import helm_python
    from packaging_support import CHART_DIR, RELEASE

    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as e,
    ):
        chart.render(
            {"networkPolicy": {"servingFrom": [{"podSelecter": {}}]}},
            name=RELEASE,
            namespace=NAMESPACE,
        )
    assert "additional properties" in str(e.value)
