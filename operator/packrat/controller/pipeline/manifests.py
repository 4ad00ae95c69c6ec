"""Pure builders for the objects a PackratPipeline owns: one PackratModel per stage, the
router's config (a ConfigMap), the router Deployment running ``packrat route``, and the
pipeline's one Service (dict in, dict out, no I/O).

Each stage is served by its own PackratModel, ``<pipeline>-<stage>``, whose Service has the
same name; the router reaches it at ``http://<pipeline>-<stage>.<namespace>.svc:8080/
predictions/<model name>``. The router pod is small and unprivileged like every Packrat
pod (non-root, read-only root filesystem, no service account token, requests == limits).
:mod:`packrat.controller.pipeline.reconcile` creates and keeps them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from packrat.controller.api import crd
from packrat.controller.api.frozen import thaw
from packrat.controller.core.model import PROFILE_ONLY_ANNOTATION, SERVING_CPUS_ANNOTATION
from packrat.controller.core.spec import API_VERSION, DEFAULT_IMAGE, KIND
from packrat.controller.serving.manifests import (
    ADMIN_TOKEN_DIR,
    ADMIN_TOKEN_KEY,
    MANAGER,
    PORT,
    admin_token_mount,
    admin_token_volume,
    base_env,
    base_labels,
    container_security,
    metadata,
    owner_reference,
    pod_security,
    router_token_name,
    scrape_annotations,
)

if TYPE_CHECKING:
    from packrat.controller.pipeline.spec import PipelineObject
    from packrat.plan.pipeline.simulate import Edge

PIPELINE_KIND = crd.PIPELINE_KIND
ROUTER_APP = "packrat-router"
LABEL_PIPELINE = "packrat.dev/pipeline"
LABEL_STAGE = "packrat.dev/stage"
LABEL_CONFIG_HASH = "packrat.dev/router-config-hash"
CONFIG_KEY = "router.yaml"
CONFIG_DIR = "/config"
ROUTER_RESOURCES = {"cpu": "1", "memory": "256Mi"}
DEFAULT_DEADLINE_FACTOR = 10


def stage_model_name(pipeline: str, stage: str) -> str:
    return f"{pipeline}-{stage}"


def router_name(pipeline: str) -> str:
    return f"{pipeline}-router"


def pipeline_owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    return owner_reference(owner, kind=PIPELINE_KIND)


def _metadata(owner: Mapping[str, Any], *, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return metadata(owner, name=name, labels=labels, kind=PIPELINE_KIND)


def pipeline_metadata(owner: Mapping[str, Any], *, name: str) -> dict[str, Any]:
    """Metadata of an object the pipeline owns (its plan ConfigMap)."""
    pipeline = owner["metadata"]["name"]
    return _metadata(owner, name=name, labels=token_labels(pipeline))


def token_labels(pipeline: str) -> dict[str, str]:
    """The pipeline's admin token Secret's labels (not the routers': it is no pod's)."""
    return {**base_labels(pipeline), LABEL_PIPELINE: pipeline}


def _labels(pipeline: str) -> dict[str, str]:
    return {**base_labels(pipeline, app=ROUTER_APP), LABEL_PIPELINE: pipeline}


def stage_labels(pipeline: str, stage: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGER, LABEL_PIPELINE: pipeline, LABEL_STAGE: stage}


def stage_model(
    owner: Mapping[str, Any],
    *,
    stage: str,
    model: Mapping[str, Any],
    batch: int,
    replicas: int,
    serving_cpus: int | None,
    autoscaling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The stage's PackratModel: the stage's model spec with the planner's batch and replicas;
    the planner's CPUs per replica in the ``packrat.dev/serving-cpus`` annotation (the model
    is still profiled on ``spec.cpus``). Before the pipeline has a plan (``serving_cpus``
    None) the model carries ``packrat.dev/profile-only``: it profiles and deploys nothing.
    ``autoscaling``: the stage model's ``spec.autoscaling`` (the pipeline's, with the stage's
    tuner reference in envelope mode), if any."""
    name = owner["metadata"]["name"]
    meta = _metadata(owner, name=stage_model_name(name, stage), labels=stage_labels(name, stage))
    if serving_cpus is not None:
        meta["annotations"] = {SERVING_CPUS_ANNOTATION: str(int(serving_cpus))}
    else:
        meta["annotations"] = {PROFILE_ONLY_ANNOTATION: "true"}
    spec = json.loads(json.dumps(thaw(model)))
    spec["batchSize"] = int(batch)
    spec["replicas"] = int(replicas)
    if autoscaling is not None:
        spec["autoscaling"] = json.loads(json.dumps(thaw(autoscaling)))
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


def router_config(pipe: PipelineObject) -> dict[str, Any]:
    """The router's config document (:func:`packrat.serve.router.parse_router_config`)."""
    name, namespace = pipe.name, pipe.namespace
    stages = {}
    for stage in pipe.stages:
        child, target = stage.model_name, stage.model.model_name
        stages[stage.name] = f"http://{child}.{namespace}.svc:{PORT}/predictions/{target}"
    deadline = pipe.deadline_ms or DEFAULT_DEADLINE_FACTOR * pipe.slo_ms
    return {
        "pipeline": name,
        "stages": stages,
        "edges": [router_edge(e) for e in pipe.edges],
        "deadlineMs": float(deadline),
        "maxDeadlineMs": float(max(deadline, 60_000.0)),
    }


def router_edge(edge: Edge) -> dict[str, Any]:
    """One edge of the router's config: its fraction (what the router draws with, or the
    planner's expectation) and ``when``, a branch the source's answer decides."""
    out: dict[str, Any] = {"from": edge.src, "to": edge.dst, "fraction": float(edge.fraction)}
    if edge.when is not None:
        out["when"] = edge.when.to_doc()
    return out


def router_configmap(pipe: PipelineObject) -> dict[str, Any]:
    owner, name = pipe.owner(), pipe.name
    text = yaml.safe_dump(router_config(pipe), sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, name=router_name(name), labels=_labels(name)),
        "data": {CONFIG_KEY: text},
    }


def config_hash(configmap: Mapping[str, Any]) -> str:
    """Changes when the router config does: in the pod template, it rolls the router."""
    return hashlib.sha256(json.dumps(configmap["data"], sort_keys=True).encode()).hexdigest()[:16]


def router_deployment(
    pipe: PipelineObject, *, replicas: int = 2, image: str = DEFAULT_IMAGE
) -> dict[str, Any]:
    """``packrat route`` behind the pipeline's Service; two replicas by default (the router
    is stateless; one is a single point of failure for every stage)."""
    owner, name = pipe.owner(), pipe.name
    labels = _labels(name)
    cm = router_configmap(pipe)
    probe = {"httpGet": {"path": "/ping", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 2}
    container = {
        "name": "route",
        "image": image,
        "command": [
            "packrat",
            "route",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_KEY}",
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--admin-token-file",  # GET /arrivals: the pipeline's token only
            f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}",
        ],
        "env": base_env(),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(ROUTER_RESOURCES), "limits": dict(ROUTER_RESOURCES)},
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            admin_token_mount(),
        ],
        "readinessProbe": {**probe, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, name=router_name(name), labels=labels),
        "spec": {
            "replicas": int(replicas),
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": {**labels, LABEL_CONFIG_HASH: config_hash(cm)},
                    "annotations": scrape_annotations(),
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(),
                    "containers": [container],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        {"name": "config", "configMap": {"name": router_name(name)}},
                        admin_token_volume(router_token_name(name)),
                    ],
                },
            },
        },
    }


def pipeline_service(pipe: PipelineObject) -> dict[str, Any]:
    """The one Service clients use: ``POST /predictions/<pipeline>`` on port 8080."""
    owner, name = pipe.owner(), pipe.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, name=name, labels=_labels(name)),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
