"""spec.model.sampleRequest: validated, part of the profile key, passed to the profiling Job."""

from __future__ import annotations

import base64
from typing import Any

from packrat.controller.core.model import model_spec, parse
from packrat.controller.core.spec import validate_spec
from packrat.controller.profiling import manifests as pm
from packrat.controller.serving import manifests as m

SAMPLE = base64.b64encode(b'{"x": [1, 2, 3]}').decode()
MAR_OWNER: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "user", "namespace": "ns", "uid": "1"},
    "spec": {
        "model": {
            "uri": "https://h/m.mar",
            "format": "mar",
            "sampleRequest": SAMPLE,
            "sampleContentType": "application/json",
        },
        "cpus": 2,
        "batchSize": 4,
    },
}


def _profile_container(job: dict[str, Any]) -> dict[str, Any]:
    init = job["spec"]["template"]["spec"]["initContainers"]
    return next(c for c in init if c["name"] == "profile")


def test_the_job_profiles_through_the_handler_with_the_sample() -> None:
    container = _profile_container(pm.profiling_job(parse(MAR_OWNER)))
    cmd = container["command"]
    assert cmd[cmd.index("--sample-request-env") + 1] == m.SAMPLE_REQUEST_ENV
    assert cmd[cmd.index("--sample-content-type") + 1] == "application/json"
    assert cmd[-2:] == ["-o", f"{m.PROFILE_DIR}/{m.PROFILE_FILE}"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[m.SAMPLE_REQUEST_ENV] == SAMPLE
    assert container["resources"]["requests"] == container["resources"]["limits"]


def test_a_zoo_model_without_sample_profiles_the_bare_model() -> None:
    owner = {**MAR_OWNER, "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4}}
    container = _profile_container(pm.profiling_job(parse(owner)))
    assert "--sample-request-env" not in container["command"]
    assert m.SAMPLE_REQUEST_ENV not in {e["name"] for e in container["env"]}


def test_a_mar_needs_a_sample_request() -> None:
    spec = {**MAR_OWNER["spec"], "model": {"uri": "https://h/m.mar", "format": "mar"}}
    assert any("sampleRequest" in e for e in validate_spec(spec))
    assert validate_spec(MAR_OWNER["spec"]) == []
    bad = {**MAR_OWNER["spec"], "model": {**MAR_OWNER["spec"]["model"], "sampleContentType": "x"}}
    assert any("sampleContentType" in e for e in validate_spec(bad))


def test_a_changed_sample_request_re_profiles() -> None:
    spec = MAR_OWNER["spec"]
    other = {**spec, "model": {**spec["model"], "sampleRequest": base64.b64encode(b"y").decode()}}
    assert model_spec(spec, image="i").profile_key != model_spec(other, image="i").profile_key
    assert model_spec(spec, image="i").profile_key == model_spec(dict(spec), image="i").profile_key
