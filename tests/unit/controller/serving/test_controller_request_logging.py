"""``spec.requestLogging`` end to end without a cluster: the CRD's schema and the operator's
validation agree, and the serving pods' command carries flags that ``packrat serve`` parses
into the request log's settings (off when the field is absent)."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from packaging_support import crd_schema

from packrat.cli import CliError, build_parser
from packrat.cli.serve import payload_log_config
from packrat.controller.core.model import model_spec
from packrat.controller.core.spec import validate_spec
from packrat.controller.serving import manifests

BASE: dict[str, Any] = {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 2}


def _command(spec: dict[str, Any]) -> list[str]:
    typed = model_spec(spec, name="resnet", namespace="ml", uid="u")
    deployment = manifests.serving_deployment(typed, slot="a", serving_hash="h", replicas=1)
    command: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


def _schema_errors(spec: dict[str, Any]) -> list[str]:
    schema = crd_schema()["properties"]["spec"]
    return [e.message for e in OAS30Validator(schema).iter_errors(spec)]


def test_off_by_default() -> None:
    command = _command(BASE)
    assert not any(a.startswith("--request-log") for a in command)
    args = build_parser().parse_args(command[1:])
    assert payload_log_config(args) is None


@pytest.mark.parametrize(
    ("logging", "sink"),
    [
        ({"sink": "stdout", "sampleRate": 0.1}, "jsonl:-"),
        (
            {"sink": "http://broker.knative.svc/ml/default", "mode": "structured", "queueSize": 50},
            "http://broker.knative.svc/ml/default",
        ),
    ],
)
def test_spec_becomes_serve_flags(logging: dict[str, Any], sink: str) -> None:
    spec = {**BASE, "requestLogging": logging}
    assert validate_spec(spec, name="resnet") == [] and _schema_errors(spec) == []
    args = build_parser().parse_args(_command(spec)[1:])
    config = payload_log_config(args)
    assert config.sink == sink
    assert config.sample_rate == logging.get("sampleRate", 1.0)
    assert config.mode == logging.get("mode", "binary")
    assert config.queue_size == logging.get("queueSize", 1000)
    assert config.source == "/packrat/namespaces/ml/packratmodels/resnet"


@pytest.mark.parametrize(
    "logging",
    [
        {"sink": "ftp://x"},
        {"sink": "stdout", "sampleRate": 0},
        {"sink": "stdout", "sampleRate": 1.5},
        {"sink": "stdout", "mode": "batched"},
        {"sink": "stdout", "queueSize": 0},
        {"sink": "stdout", "sampel": 1},
        {"sampleRate": 0.5},
    ],
)
def test_bad_logging_is_refused_by_the_crd_and_the_operator(logging: dict[str, Any]) -> None:
    spec = {**BASE, "requestLogging": logging}
    assert validate_spec(spec, name="resnet"), logging
    from packaging_support import strict_schema

    schema = strict_schema(crd_schema()["properties"]["spec"])
    assert list(OAS30Validator(schema).iter_errors(spec)), logging


@pytest.mark.parametrize("sink", ["stdout\n", "http://broker/ml\n"])
def test_a_sink_with_a_trailing_newline_is_refused(sink: str) -> None:
    # the operator's check (a Python `$` matches before a final newline; the API server's
    # RE2 pattern does not, so only the operator's side is asserted here)
    assert validate_spec({**BASE, "requestLogging": {"sink": sink}}, name="resnet")


def test_serve_refuses_bad_flags_with_one_line() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "tiny", "--plan", "p.json", "--request-log", "s3://bucket"]
    )
    with pytest.raises(CliError, match="expected jsonl:PATH"):
        payload_log_config(args)


def test_serve_takes_stdout_as_the_crd_and_docs_name_it() -> None:
    """docs-found item 1: `packrat serve --request-log stdout` (as docs/serving.md and the
    CRD's sink say) was refused; it is the jsonl:- sink."""
    args = build_parser().parse_args(
        ["serve", "--model", "tiny", "--plan", "p.json", "--request-log", "stdout"]
    )
    assert payload_log_config(args).sink == "jsonl:-"


def test_a_logging_change_is_a_new_pod_template() -> None:
    def template(spec: dict[str, Any]) -> str:
        return model_spec(spec, name="resnet").template_hash(2)

    plain = template(BASE)
    logged = {**BASE, "requestLogging": {"sink": "stdout"}}
    assert template(logged) != plain
    sampled = {**BASE, "requestLogging": {"sink": "stdout", "sampleRate": 0.5}}
    assert template(sampled) != template(logged)
    assert template(dict(BASE)) == plain  # absent: as before
