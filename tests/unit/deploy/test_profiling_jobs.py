"""profiling-jobs/: generated from the operator's Job builder, valid, Guaranteed, in step."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from packaging_support import ROOT, load_script

GEN = load_script("gen_profiling_jobs")


@pytest.mark.parametrize("name", sorted(GEN.JOBS))
def test_file_is_the_builders_output(name: str) -> None:
    path = ROOT / "profiling-jobs" / name
    assert path.read_text() == GEN.render(name), f"{path} is stale: run `make profiling-jobs`"


def test_every_job_file_is_generated() -> None:
    files = {p.name for p in (ROOT / "profiling-jobs").glob("*.yaml")}
    assert files == set(GEN.JOBS)
    assert GEN.main(["--check"]) == 0


@pytest.mark.parametrize("name", sorted(GEN.JOBS))
def test_job_is_valid_guaranteed_and_publishes_to_its_log(name: str) -> None:
    job = yaml.safe_load((ROOT / "profiling-jobs" / name).read_text())
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    assert "ownerReferences" not in job["metadata"] and "namespace" not in job["metadata"]
    pod = job["spec"]["template"]["spec"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        res = container["resources"]
        assert res["requests"] == res["limits"] and res["limits"]["cpu"].isdigit()
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["containers"][0]["command"][0] == "cat"  # the profile is the publish log
    assert pod["initContainers"][-1]["command"][:2] == ["packrat", "profile"]


def test_the_s3_job_fetches_with_the_secret_mounted_into_fetch_only() -> None:
    job = yaml.safe_load((ROOT / "profiling-jobs" / "mar-s3.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    fetch, profile = pod["initContainers"]
    assert fetch["command"][:3] == [
        "packrat",
        "fetch",
        "s3://my-models/classifier/v3/classifier.mar",
    ]
    assert any(v.get("secret", {}).get("secretName") == "model-store" for v in pod["volumes"])
    assert "model-credentials" in {m["name"] for m in fetch["volumeMounts"]}
    assert "model-credentials" not in {m["name"] for m in profile["volumeMounts"]}
    assert "--sample-request-env" in profile["command"]
