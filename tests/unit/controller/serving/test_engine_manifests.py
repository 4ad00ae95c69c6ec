"""``spec.engines`` in what the operator creates (issue 35): the profiling Job converts, checks
and profiles the engines into its artefacts volume; each serving pod's ``convert-engines``
init container finds or converts them under the same cache key with the same gate into the
pod's own volume, and ``packrat serve`` loads the plan's engine from it; eager only (unset)
keeps the objects and hashes of before."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from packrat.cli import build_parser
from packrat.controller.core import spec as spec_module
from packrat.controller.core.model import parse
from packrat.controller.profiling.manifests import profiling_job
from packrat.controller.serving import manifests as m
from packrat.runtime import engines as runtime_engines

OWNER: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "tiny", "namespace": "ns", "uid": "1234"},
    "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4},
}


def _owner(**spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(OWNER)
    out["spec"].update(spec)
    return out


def _pod(owner: dict[str, Any]) -> dict[str, Any]:
    dep = m.serving_deployment(parse(owner), slot="a", serving_hash="h", replicas=2)
    pod: dict[str, Any] = dep["spec"]["template"]["spec"]
    return pod


def _job_pod(owner: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = profiling_job(parse(owner))["spec"]["template"]["spec"]
    return pod


def test_the_crd_names_the_runtime_engines() -> None:
    assert spec_module.ENGINES == runtime_engines.ENGINES


def test_the_job_converts_checks_and_profiles_the_engines() -> None:
    pod = _job_pod(_owner(engines=["eager", "onnxruntime"]))
    (profile,) = [c for c in pod["initContainers"] if c["name"] == "profile"]
    cmd = profile["command"]
    assert cmd[cmd.index("--engines") + 1] == "eager,onnxruntime"
    assert cmd[cmd.index("--missing-engines") + 1] == "leave-out"  # a condition, not a crash
    assert cmd[cmd.index("--artefacts") + 1] == m.ARTEFACTS_DIR
    assert cmd[-2] == "-o"  # the output stays last
    assert {"name": m.ARTEFACTS_VOLUME, "mountPath": m.ARTEFACTS_DIR} in profile["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == m.ARTEFACTS_VOLUME]
    assert "sizeLimit" in volume["emptyDir"]
    # the command parses as packrat profile's (no flag the CLI does not know)
    args = build_parser("profile").parse_args(cmd[1:])
    assert args.engines == "eager,onnxruntime" and args.missing_engines == "leave-out"


def test_the_pods_convert_in_an_init_container_and_serve_from_the_artefacts() -> None:
    pod = _pod(_owner(engines=["eager", "openvino"]))
    (convert,) = [c for c in pod["initContainers"] if c["name"] == "convert-engines"]
    cmd = convert["command"]
    assert cmd[:2] == ["packrat", "convert"]
    assert cmd[cmd.index("--engines") + 1] == "eager,openvino"
    assert cmd[cmd.index("--artefacts") + 1] == m.ARTEFACTS_DIR
    assert convert["resources"]["requests"] == convert["resources"]["limits"]  # Guaranteed
    assert convert["securityContext"]["readOnlyRootFilesystem"] is True
    args = build_parser("convert").parse_args(cmd[1:])
    assert args.engines == "eager,openvino"
    (serve,) = pod["containers"]
    assert serve["command"][serve["command"].index("--artefacts") + 1] == m.ARTEFACTS_DIR
    mount = next(x for x in serve["volumeMounts"] if x["name"] == m.ARTEFACTS_VOLUME)
    assert mount["readOnly"] is True  # the serve container only reads what the init checked
    assert [v["name"] for v in pod["volumes"]].count(m.ARTEFACTS_VOLUME) == 1


def test_a_mars_pods_convert_its_module_from_the_sample_request_the_job_used() -> None:
    mar = {
        "uri": "https://host/m.mar",
        "format": "mar",
        "sampleRequest": "WzAuNV0=",
        "sampleContentType": "application/json",
    }
    owner = _owner(model=mar, engines=["eager", "onnxruntime"], runtime="native")
    (convert,) = [c for c in _pod(owner)["initContainers"] if c["name"] == "convert-engines"]
    args = build_parser("convert").parse_args(convert["command"][1:])
    assert args.sample_request_env == m.SAMPLE_REQUEST_ENV
    assert args.sample_content_type == "application/json"
    (job,) = [c for c in _job_pod(owner)["initContainers"] if c["name"] == "profile"]
    sample = {"name": m.SAMPLE_REQUEST_ENV, "value": "WzAuNV0="}
    assert sample in convert["env"] and sample in job["env"]  # the same body as the profile's
    # a zoo model's request only chooses the handler it is profiled through: nothing to pass
    zoo = _owner(model={"zoo": "tiny", "sampleRequest": "WzAuNV0="}, engines=["onnxruntime"])
    (plain,) = [c for c in _pod(zoo)["initContainers"] if c["name"] == "convert-engines"]
    assert "--sample-request-env" not in plain["command"]
    assert all(e["name"] != m.SAMPLE_REQUEST_ENV for e in plain["env"])


def test_eager_only_keeps_the_objects_and_hashes_of_before() -> None:
    plain, eager = parse(OWNER), parse(_owner(engines=["eager"]))
    assert plain.engines is None and eager.engines is None
    assert plain.profile_key == eager.profile_key
    assert plain.serving_hash({"cpus": 2}) == eager.serving_hash({"cpus": 2})
    pod = _pod(_owner(engines=["eager"]))
    assert "initContainers" not in pod
    assert "--artefacts" not in pod["containers"][0]["command"]
    job = _job_pod(OWNER)
    assert "--engines" not in job["initContainers"][0]["command"]


def test_engines_are_part_of_the_profile_key_and_the_serving_hash() -> None:
    plain, more = parse(OWNER), parse(_owner(engines=["eager", "onnxruntime"]))
    assert plain.profile_key != more.profile_key  # a new engine set is profiled again
    assert plain.serving_hash({"cpus": 2}) != more.serving_hash({"cpus": 2})
    every = parse(_owner(engines=["all"]))
    assert every.engines == ("all",)
    cmd = _job_pod(_owner(engines=["all"]))["initContainers"][0]["command"]
    assert cmd[cmd.index("--engines") + 1] == "all"


@pytest.mark.parametrize(
    "engines",
    [[], ["fast"], ["eager", "eager"], ["all", "eager"], "openvino", ["openvino"] * 5],
)
def test_bad_engines_are_one_clear_error(engines: Any) -> None:
    errors = spec_module.validate_spec({**OWNER["spec"], "engines": engines})
    # one message per violation (from the CRD's schema and CEL rule), each naming spec.engines
    assert errors and all(e.startswith("spec.engines") for e in errors), errors


def test_engines_other_than_eager_need_the_native_runtime() -> None:
    errors = spec_module.validate_spec(
        {**OWNER["spec"], "engines": ["openvino"], "runtime": "torchserve"}
    )
    assert errors == ["spec.engines other than eager need the native runtime (spec.runtime)"]
    assert not spec_module.validate_spec(
        {**OWNER["spec"], "engines": ["eager"], "runtime": "torchserve"}
    )


def test_a_shared_claim_holds_the_jobs_artefacts_for_every_pod() -> None:
    owner = _owner(engines=["eager", "onnxruntime"], artefactsClaim="art")
    claim = {"name": m.ARTEFACTS_VOLUME, "persistentVolumeClaim": {"claimName": "art"}}
    assert claim in _job_pod(owner)["volumes"]
    assert claim in _pod(owner)["volumes"]
    assert parse(owner).profile_key == parse(_owner(engines=["eager", "onnxruntime"])).profile_key
    hashes = {parse(o).serving_hash({"cpus": 2}) for o in (owner, _owner(engines=["openvino"]))}
    assert len(hashes) == 2  # the pods' volume changed: new pods


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({}, "spec: artefactsClaim needs engines beyond eager"),  # the CRD's CEL rule
        ({"engines": ["eager"]}, "spec: artefactsClaim needs engines beyond eager"),
        (
            {"engines": ["openvino"], "artefactsClaim": "Bad_Name"},
            "spec.artefactsClaim must match",  # the CRD's pattern
        ),
    ],
)
def test_a_bad_claim_is_one_clear_error(extra: dict[str, Any], error: str) -> None:
    errors = spec_module.validate_spec({**OWNER["spec"], "artefactsClaim": "art", **extra})
    assert len(errors) == 1 and error in errors[0], errors
