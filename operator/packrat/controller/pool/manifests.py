"""Pure builders for what a PackratPool owns (dict in, dict out, no I/O).

One Deployment of one replica per pool pod (``<pool>-<i>``): placement gives each pod its
own models, so each pod has its own config (a ConfigMap, ``<pool>-<i>``) and its own
identity (the ``packrat.dev/pool-pod`` label) that a pooled model's Service selects. One
Service for the whole pool (``<pool>``: its metrics and ``/pool/status``). The pods run
``python -m packrat.serve.pool`` unprivileged like every Packrat pod (non-root, read-only
root filesystem, no service account token, requests == limits), layer files on an
emptyDir sized by the pod's memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from packrat.controller.api import crd
from packrat.controller.core.spec import DEFAULT_IMAGE
from packrat.controller.pool.spec import PoolPlan, PoolSpec
from packrat.controller.serving import manifests as m

POOL_KIND = crd.POOL_KIND
POOL_APP = "packrat-pool"
LABEL_POOL = "packrat.dev/pool"
LABEL_POOL_POD = m.LABEL_POOL_POD
CONFIG_KEY = "pool.json"
CONFIG_DIR = "/config"
CACHE_DIR = "/cache"


def pod_name(pool: str, index: int) -> str:
    return f"{pool}-{index}"


def pool_labels(pool: str) -> dict[str, str]:
    return {**m.base_labels(pool, app=POOL_APP), LABEL_POOL: pool}


def pod_labels(pool: str, pod: str) -> dict[str, str]:
    return {**pool_labels(pool), LABEL_POOL_POD: pod}


def _metadata(spec: PoolSpec, *, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return m.metadata(spec.owner(), name=name, labels=labels, kind=POOL_KIND)


def pool_config(
    spec: PoolSpec,
    models: Sequence[tuple[str, str]],
    plans: Mapping[str, PoolPlan] | None = None,
) -> dict[str, Any]:
    """The pod's ``python -m packrat.serve.pool`` configuration: ``models`` (name, zoo
    architecture) under the pool's budget, each with its plan's threads and batch once its
    plan on the pool's cores is made (``plans``); the layer files' directory is given on the
    command line (the cache volume)."""
    plans = plans or {}
    return {
        "directory": "layers",
        "budget_bytes": spec.budget_bytes,
        "policy": spec.policy,
        "mode": spec.mode,
        "threads": spec.cpus,
        "models": [
            {"name": n, "spec": zoo, **(plans[n].entry() if n in plans else {})}
            for n, zoo in sorted(models)
        ],
    }


def config_digest(configmap: Mapping[str, Any]) -> str:
    """SHA-256 of the config file a pool pod reads from ``configmap`` (its ``/pool/status``
    reports the same digest of the file it serves)."""
    return hashlib.sha256(str(configmap["data"][CONFIG_KEY]).encode()).hexdigest()


def configmap(spec: PoolSpec, pod: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, name=pod, labels=pod_labels(spec.name, pod)),
        "data": {CONFIG_KEY: json.dumps(config, sort_keys=True, indent=1)},
    }


def _container(spec: PoolSpec, *, image: str) -> dict[str, Any]:
    resources = {"cpu": str(spec.cpus), "memory": spec.memory}
    probe = {
        "httpGet": {"path": "/v2/health/ready", "port": "http"},
        "periodSeconds": 2,
        "timeoutSeconds": 2,
    }
    return {
        "name": "pool",
        "image": image,
        "command": ["python", "-m", "packrat.serve.pool", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "args": [
            *("--directory", f"{CACHE_DIR}/layers", "--host", "0.0.0.0", "--port", str(m.PORT)),
            *("--admin-token-file", f"{m.ADMIN_TOKEN_DIR}/{m.ADMIN_TOKEN_KEY}"),
        ],
        "env": m.base_env(),
        "ports": [{"name": "http", "containerPort": m.PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": m.container_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            m.admin_token_mount(),
        ],
        "readinessProbe": {**probe, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 30},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def deployment(
    spec: PoolSpec, pod: str, *, hosting: bool, image: str = DEFAULT_IMAGE
) -> dict[str, Any]:
    """Pool pod ``pod``: one replica while it hosts a model (none while it hosts none: the
    pool process serves at least one model). A new config of the same pod is not a new
    template: the pool process reloads its mounted ConfigMap, adding and dropping models
    while the others serve. A new template (image, shape) rolls it with a surge."""
    labels = pod_labels(spec.name, pod)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, name=pod, labels=labels),
        "spec": {
            "replicas": 1 if hosting else 0,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                # no config hash here: the pod reloads its mounted config (no restart)
                "metadata": {"labels": labels, "annotations": m.scrape_annotations()},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": m.pod_security(),
                    "containers": [_container(spec, image=spec.image or image)],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
                        {"name": "cache", "emptyDir": {"sizeLimit": spec.memory}},
                        {"name": "config", "configMap": {"name": pod}},
                        m.admin_token_volume(m.pool_token_name(spec.name)),
                    ],
                },
            },
        },
    }


def _ports() -> list[dict[str, Any]]:
    return [{"name": "http", "port": m.PORT, "targetPort": "http", "protocol": "TCP"}]


def service(spec: PoolSpec) -> dict[str, Any]:
    """The pool's Service (every pool pod: ``/pool/status``, ``/metrics``)."""
    labels = pool_labels(spec.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name=spec.name, labels=labels),
        "spec": {"type": "ClusterIP", "selector": labels, "ports": _ports()},
    }


def member_service(owner: Mapping[str, Any], *, pool: str, pod: str) -> dict[str, Any]:
    """A pooled model's own Service (the model owns it, under its name): the pool pod that
    hosts it, so ``/v2/models/<model>`` and ``/predictions/<model>`` reach it as before."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": m.metadata(
            owner, name=name, labels={**m.base_labels(name), m.LABEL_MODEL: name}
        ),
        "spec": {"type": "ClusterIP", "selector": pod_labels(pool, pod), "ports": _ports()},
    }


def pod_of_service(svc: Mapping[str, Any] | None) -> str | None:
    """The pool pod a Service selects, if it selects one."""
    selector = ((svc or {}).get("spec") or {}).get("selector") or {}
    pod = selector.get(LABEL_POOL_POD)
    return pod if isinstance(pod, str) else None
