"""Issue 38: the serving and profiling pods' /tmp emptyDir has a size limit (it holds the weight
file, a .mar's extraction and TorchServe's files): without one, a pod could fill its node's
disk, and each killed container's weight file stayed there."""

from __future__ import annotations

from typing import Any

from packrat.controller.core.model import parse
from packrat.controller.core.storage import StorageLimits
from packrat.controller.profiling import manifests as pm
from packrat.controller.serving import manifests as m

OWNER: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "tiny", "namespace": "ns", "uid": "1234"},
    "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4},
}
GiB = 1024**3


def _tmp(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "tmp"]
    return dict(volume["emptyDir"])


def test_the_serving_pods_tmp_is_bounded() -> None:
    spec = parse(OWNER, default_image="img")
    limits = StorageLimits(max_model_bytes=GiB)
    pod = m.build_serving_pod_spec(spec, slot="a", limits=limits)
    assert _tmp(pod).get("sizeLimit") == str(3 * GiB)  # two model copies and 1 GiB beside


def test_the_profiling_pods_tmp_is_bounded() -> None:
    spec = parse(OWNER, default_image="img")
    job = pm.profiling_job(spec, limits=StorageLimits(max_model_bytes=GiB))
    assert "sizeLimit" in _tmp(job["spec"]["template"]["spec"])
