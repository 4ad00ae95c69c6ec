"""The serving pod's gRPC port (the Open Inference Protocol) in what the operator creates: the
``serve`` command asks for it, the container names it, the Service exposes it as h2c."""

from __future__ import annotations

from typing import Any

from packrat.controller.core.model import parse
from packrat.controller.serving import manifests as m

OWNER: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "tiny", "namespace": "ns", "uid": "1234"},
    "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4},
}


def test_the_pod_and_its_service_carry_the_grpc_port() -> None:
    dep = m.serving_deployment(parse(OWNER), slot="a", serving_hash="h", replicas=1)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"][c["command"].index("--grpc-port") + 1] == "8081"
    assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in c["ports"]
    svc = m.service(OWNER, slot="a")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["port"] == 8081 and ports["grpc"]["targetPort"] == "grpc"
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert ports["http"]["port"] == 8080
