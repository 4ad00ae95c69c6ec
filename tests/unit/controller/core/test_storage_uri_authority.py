"""Issue 38: the operator's checks of a model URL read its host as the fetch does. An authority
hiding a second host (``?@``, ``#@``, ``\\@``, user info) is invalid in spec.model and
spec.canary.model, and the storage-host policy covers every URL a model's pods fetch: the
canary's storageUri and a model.uri too."""

from __future__ import annotations

from typing import Any

import pytest

from packrat.controller.core.overrides import ModelPolicy, refused_by_policy
from packrat.controller.core.spec import validate_spec

BASE: dict[str, Any] = {"cpus": 2, "batchSize": 4, "profiling": {"maxBatch": 8}}
HIDING = (
    "http://attacker.example.net?@models.example.com/m.pt",
    "http://attacker.example.net#@models.example.com/m.pt",
    "http://attacker.example.net\\@models.example.com/m.pt",
    "https://user:pw@models.example.com/m.pt",
)


def _errors(spec: dict[str, Any]) -> list[str]:
    return validate_spec({**BASE, **spec})


@pytest.mark.parametrize("uri", HIDING)
@pytest.mark.parametrize("field", ["storageUri", "uri"])
def test_a_hiding_authority_is_invalid(uri: str, field: str) -> None:
    model = {field: uri, "format": "torchscript"}
    assert any(f"spec.model.{field}" in e for e in _errors({"model": model}))
    canary = {"model": model, "trafficPercent": 10}
    errors = _errors({"model": {"zoo": "tiny"}, "canary": canary})
    assert any(f"model.{field}" in e for e in errors), errors


def test_plain_urls_stay_valid() -> None:
    for model in (
        {"storageUri": "https://models.example.com:8443/a/m.pt?v=1", "format": "torchscript"},
        {"storageUri": "s3://bucket_1/k.pt", "format": "torchscript"},
        {"storageUri": "http://[fd00::1]:9000/m.pt", "format": "torchscript"},
        {"uri": "https://models.example.com/m.pt", "format": "torchscript"},
    ):
        assert _errors({"model": model}) == []


HOSTS = ("models.example.com",)


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"canary": {"model": {"storageUri": "https://evil.example.net/m.pt"}}}, "canary"),
        ({"model": {"uri": "https://evil.example.net/m.mar"}}, "spec.model.uri"),
        ({"canary": {"model": {"uri": "https://evil.example.net/m.mar"}}}, "canary"),
        ({"canary": {"model": {"storageUri": "https://models.example.com/m.pt"}}}, None),
        ({"model": {"storageUri": "s3://bucket/m.pt"}}, None),
    ],
)
def test_the_storage_host_policy_covers_every_fetched_url(
    spec: dict[str, Any], refused: str | None
) -> None:
    why = refused_by_policy(
        {"model": {"zoo": "tiny"}, **spec}, ModelPolicy(), default_image="i", storage_hosts=HOSTS
    )
    assert (refused is None) == (why == []), why
    if refused is not None:
        assert refused in why[0] and "evil.example.net" in why[0]


@pytest.mark.parametrize(
    ("sink", "ok"),
    [
        ("http://127.0.0.1:8081/models", False),  # the pod's own internal ports
        ("http://169.254.169.254/latest/", False),  # the metadata service
        ("http://localhost/", False),
        ("http://broker.example.com?@10.0.0.1/", False),
        ("http://broker-ingress.knative-eventing.svc.cluster.local/ns/b", True),
        ("stdout", True),
    ],
)
def test_the_request_log_sink_obeys_the_egress_policy(sink: str, ok: bool) -> None:
    errors = _errors({"model": {"zoo": "tiny"}, "requestLogging": {"sink": sink}})
    assert (errors == []) == ok, errors
