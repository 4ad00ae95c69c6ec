"""The PackratPipeline's router objects, built from the shipped example: valid Kubernetes,
unprivileged, owned by the pipeline, wired to the stages' Services, and the router config
they carry is what ``packrat route`` reads."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging_support import EXAMPLES_DIR, check_packrat_argv, load_yaml_docs

from packrat.controller.pipeline.manifests import (
    CONFIG_KEY,
    LABEL_CONFIG_HASH,
    pipeline_service,
    router_configmap,
    router_deployment,
)
from packrat.controller.pipeline.spec import PipelineObject, parse_pipeline
from packrat.serve.router import parse_router_config

EXAMPLE = load_yaml_docs(EXAMPLES_DIR / "pipelines" / "cascade.yaml")[0]


def owner() -> dict[str, Any]:
    out = copy.deepcopy(EXAMPLE)
    out["metadata"] |= {"namespace": "shop", "uid": "uid-7"}
    return out


def pipe() -> PipelineObject:
    return parse_pipeline(owner())


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_objects_are_valid_kubernetes(version: str) -> None:
    for obj in (router_configmap(pipe()), router_deployment(pipe()), pipeline_service(pipe())):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_router_config_is_what_packrat_route_reads() -> None:
    text = router_configmap(pipe())["data"][CONFIG_KEY]
    config = parse_router_config(yaml.safe_load(text))
    assert config.pipeline == "cascade"
    assert config.stages == {
        "screen": "http://cascade-screen.shop.svc:8080/predictions/cascade-screen",
        "classify": "http://cascade-classify.shop.svc:8080/predictions/cascade-classify",
    }
    assert [(e.src, e.dst, e.fraction) for e in config.edges] == [("screen", "classify", 0.2)]
    assert config.deadline_ms == 4000.0


def test_a_branch_the_first_stage_decides_reaches_the_router() -> None:
    o = owner()
    o["spec"]["edges"][0]["when"] = {"json": "confidence", "below": 0.8}
    text = router_configmap(parse_pipeline(o))["data"][CONFIG_KEY]
    config = parse_router_config(yaml.safe_load(text))
    (edge,) = config.edges
    assert edge.when is not None and edge.when.to_doc() == {"json": "confidence", "below": 0.8}
    assert edge.fraction == 0.2  # the planner's expectation until it is measured


def test_the_deadline_defaults_to_ten_times_the_slo() -> None:
    o = owner()
    del o["spec"]["deadlineMs"]
    config = parse_router_config(
        yaml.safe_load(router_configmap(parse_pipeline(o))["data"][CONFIG_KEY])
    )
    assert config.deadline_ms == 8000.0


def test_the_router_pod_is_unprivileged_bounded_and_runs_packrat_route() -> None:
    dep = router_deployment(pipe())
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert check_packrat_argv(c["command"][1:]) == "route"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    sec = c["securityContext"]
    assert sec["readOnlyRootFilesystem"] and not sec["allowPrivilegeEscalation"]
    assert sec["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"] == c["resources"]["limits"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/config"]["readOnly"] is True
    assert dep["spec"]["replicas"] == 2
    # issue 38: /arrivals needs the pipeline's token, its Secret mounted read-only
    token = c["command"][c["command"].index("--admin-token-file") + 1]
    (mount,) = [m for path, m in mounts.items() if token.startswith(f"{path}/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == f"{pipe().name}-router-token"


def test_everything_is_owned_by_the_pipeline_and_the_service_selects_the_router() -> None:
    cm, dep, svc = router_configmap(pipe()), router_deployment(pipe()), pipeline_service(pipe())
    for obj in (cm, dep, svc):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("PackratPipeline", "cascade", "uid-7")
        assert ref["controller"] is True
        assert obj["metadata"]["namespace"] == "shop"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["metadata"]["name"] == "cascade"


def test_a_changed_dag_rolls_the_router() -> None:
    before = router_deployment(pipe())["spec"]["template"]["metadata"]["labels"]
    o = owner()
    o["spec"]["edges"][0]["fraction"] = 0.5
    after = router_deployment(parse_pipeline(o))["spec"]["template"]["metadata"]["labels"]
    assert before[LABEL_CONFIG_HASH] != after[LABEL_CONFIG_HASH]
    same = router_deployment(pipe())["spec"]["template"]["metadata"]["labels"]
    assert same[LABEL_CONFIG_HASH] == before[LABEL_CONFIG_HASH]
