"""Pure builders for the serving objects a PackratModel owns (its slots' Deployments and its
Service) and the pod parts every owned object shares (dict in, dict out); the profiling Job
and ConfigMap are in ``profile_manifests``.

Kept free of I/O so each object can be checked offline against the Kubernetes schemas, and so
the Guaranteed-QoS rule (every container, init containers included, requests == limits with
integer CPUs) is enforced in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.frozen import thaw
from packrat.controller.core import storage
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.model_source import FORMAT_SUFFIX
from packrat.controller.core.options.request_logging import request_log_args
from packrat.controller.core.overrides import apply_pod
from packrat.controller.core.spec import API_VERSION, DEFAULT_ROUNDING, ENGINES, KIND
from packrat.runtime.inputs import encode, parse_inputs

PORT = 8080
GRPC_PORT = 8081  # the Open Inference Protocol over gRPC (packrat serve --grpc-port)
PRESTOP_SECONDS = 5
RUN_AS_USER = 10001
SERVING_APP = "packrat-serving"
PROFILING_APP = "packrat-profiling"
MANAGER = "packrat-operator"
LABEL_MODEL = "packrat.dev/model"
LABEL_SLOT = "packrat.dev/slot"
LABEL_POOL_POD = "packrat.dev/pool-pod"  # a PackratPool's pod (controller/pool/manifests.py)
LABEL_PROFILE_KEY = "packrat.dev/profile-key"
LABEL_SERVING_HASH = "packrat.dev/serving-hash"
# on every serving Deployment: a background delete then leaves its ReplicaSet and pods serving
# until the operator has a replacement ready and lets it go (see ``protection``)
FINALIZER_SERVING = "packrat.dev/serving"
ANNOTATION_PLAN = "packrat.dev/plan"
# on a slot rendered for a plan it does not serve yet (see ``serving.ensure_deployment``)
ANNOTATION_PLAN_HASH = "packrat.dev/plan-hash"
PLAN_ENV = "PACKRAT_PLAN"
PLAN_KEY = "plan.json"  # the plan's key in a slot's plan ConfigMap
ADMIN_TOKEN_ENV = "PACKRAT_ADMIN_TOKEN"  # the in-pod switch's bearer token (``--admin-token-env``)
# the token Secret mounted as a file (``--admin-token-file``): in no process's environment,
# and updated in place by the kubelet when the Secret is replaced (a rotated token)
ADMIN_TOKEN_DIR = "/var/run/packrat/admin"
ADMIN_TOKEN_VOLUME = "admin-token"
ADMIN_TOKEN_KEY = "token"  # its key in the model's admin token Secret
PROFILE_FILE = "profile.json"
PROFILE_DIR = "/profile"
SAMPLE_REQUEST_ENV = "PACKRAT_SAMPLE_REQUEST"
MODEL_DIR = "/models"
# the engines' converted artefacts (spec.engines). The storage model has no volume of its own
# that the profiling Job and the pods share (a profile comes back through the Job's log into a
# ConfigMap, 1 MiB at most; model files are fetched into each pod or mounted read-only), so:
# with spec.artefactsClaim (a ReadWriteMany claim) the Job converts onto it once and every
# pod's ``convert-engines`` init container finds the artefacts there under the profile's cache
# key and checks them with the profile's gate, converting nothing; without it the Job and each
# pod have their own emptyDir and the init container converts once per pod. Either way every
# instance and every in-pod switch of a pod reuses them.
ARTEFACTS_DIR = "/artefacts"
ARTEFACTS_VOLUME = "artefacts"
ARTEFACTS_MOUNT = {"name": ARTEFACTS_VOLUME, "mountPath": ARTEFACTS_DIR}
SLOTS = ("a", "b")


def other_slot(slot: str) -> str:
    return "b" if slot == "a" else "a"


def deployment_name(name: str, slot: str) -> str:
    return f"{name}-{slot}"


def plan_configmap_name(name: str, slot: str) -> str:
    """The slot's plan ConfigMap: the plan its pods start on (``PACKRAT_PLAN``)."""
    return f"{name}-{slot}-plan"


def admin_token_name(name: str) -> str:
    """The model's admin token Secret (the serving pods' ``POST /admin/plan`` bearer token)."""
    return f"{name}-admin-token"


def router_token_name(pipeline: str) -> str:
    """A pipeline's admin token Secret: its routers' ``/arrivals`` needs it."""
    return f"{pipeline}-router-token"


def pool_token_name(pool: str) -> str:
    """A pool's admin token Secret: its pods' ``/pool/status`` needs it."""
    return f"{pool}-pool-token"


def admin_token_volume(secret: str) -> dict[str, Any]:
    """The volume of an admin token Secret (a model's, a pipeline's, a pool's)."""
    return {"name": ADMIN_TOKEN_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}}


def admin_token_mount() -> dict[str, Any]:
    """Its mount, read-only: the process reads ``--admin-token-file`` and ``previous``."""
    return {"name": ADMIN_TOKEN_VOLUME, "mountPath": ADMIN_TOKEN_DIR, "readOnly": True}


def profile_object_name(name: str, key: str) -> str:
    """Name of both the profiling Job and the profile ConfigMap for a profile key."""
    return f"{name}-profile-{key[:8]}"


def owner_reference(owner: Mapping[str, Any], *, kind: str = KIND) -> dict[str, Any]:
    """The controller reference to ``owner``, a Packrat object of ``kind``."""
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def base_labels(name: str, *, app: str = SERVING_APP) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGER,
    }


def metadata(
    owner: Mapping[str, Any], *, name: str, labels: Mapping[str, str], kind: str = KIND
) -> dict[str, Any]:
    """An owned object's metadata: in ``owner``'s namespace, controlled by it."""
    return {
        "name": name,
        "namespace": owner["metadata"].get("namespace", "default"),
        "labels": dict(labels),
        "ownerReferences": [owner_reference(owner, kind=kind)],
    }


def scrape_annotations() -> dict[str, str]:
    """Pod annotations that have Prometheus scrape ``/metrics`` on :data:`PORT`."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": "/metrics",
    }


def guaranteed_resources(model: ModelSpec) -> dict[str, Any]:
    """requests == limits, integer CPUs: the pod gets Guaranteed QoS and exclusive cores."""
    amount = {"cpu": str(model.cpus), "memory": model.memory}
    return {"requests": dict(amount), "limits": dict(amount)}


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def scheduling(model: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if model.node_selector:
        out["nodeSelector"] = thaw(model.node_selector)
    if model.tolerations:
        out["tolerations"] = thaw(model.tolerations)
    if model.affinity:
        out["affinity"] = thaw(model.affinity)
    return out


def base_env() -> list[dict[str, Any]]:
    return [
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def model_source(
    spec: ModelSpec, *, limits: storage.StorageLimits = storage.DEFAULT_LIMITS
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(SPEC for ``--model``, extra volumes, extra volume mounts) for the spec's model
    (``limits``: the operator's, which size a fetched model's emptyDir)."""
    model = spec.source
    if model.zoo is not None:
        return model.zoo, [], []
    suffix = FORMAT_SUFFIX.get(str(model.format), ".pt")
    if model.storage_uri is not None:
        return storage.storage_source(
            thaw(model.doc), model_dir=MODEL_DIR, suffix=suffix, limits=limits
        )
    mount = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
    if model.uri is not None:
        return f"{MODEL_DIR}/model{suffix}", [limits.model_volume()], [mount]
    volume = model.volume
    assert volume is not None  # exactly one source (a valid spec)
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": volume.claim, "readOnly": True}}
        if volume.claim is not None
        else {"configMap": {"name": volume.config_map}}
    )
    return f"{MODEL_DIR}/{volume.path}", [{"name": "model", **source}], [mount]


def fetch_init_container(
    spec: ModelSpec,
    *,
    expect_version: bool = False,
    limits: storage.StorageLimits = storage.DEFAULT_LIMITS,
) -> dict[str, Any] | None:
    """For uri and storageUri models: fetch the file into the shared emptyDir (Guaranteed-sized).

    ``expect_version`` (the profiling Job) makes the fetch fail if the object is no longer the
    version the profile is keyed by.
    """
    model = spec.source
    image = spec.image
    if model.storage_uri is not None:
        target, _, model_mounts = model_source(spec)
        return storage.fetch_container(
            thaw(model.doc),
            target=target,
            model_mount=model_mounts[0],
            base={
                "image": image,
                "resources": guaranteed_resources(spec),
                "securityContext": container_security(),
                "env": base_env(),
                "terminationMessagePolicy": "FallbackToLogsOnError",
            },
            expect_version=expect_version,
            limits=limits,
        )
    if model.uri is None:
        return None
    target, _, _ = model_source(spec)
    return {
        "name": "fetch-model",
        "image": image,
        "command": ["packrat", "fetch", model.uri, "-o", target, *limits.fetch_flags()],
        "resources": guaranteed_resources(spec),
        "securityContext": container_security(),
        "env": base_env(),
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def inputs_args(spec: ModelSpec) -> list[str]:
    """``--inputs`` for a model file whose spec declares them (checked by the spec check)."""
    inputs = spec.source.inputs
    return [] if inputs is None else ["--inputs", encode(parse_inputs(inputs))]


def engines_volume(
    spec: ModelSpec, limits: storage.StorageLimits
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """([the artefacts volume], [its mount]) when spec.engines asks for more than eager: the
    shared claim, or an emptyDir sized for an artefact of every engine (each about one copy
    of the weights)."""
    if not spec.engines:
        return [], []
    volume: dict[str, Any] = {"name": ARTEFACTS_VOLUME}
    if spec.artefacts_claim:
        volume["persistentVolumeClaim"] = {"claimName": spec.artefacts_claim}
    else:
        volume["emptyDir"] = {"sizeLimit": str(len(ENGINES) * limits.max_model_bytes)}
    return [volume], [dict(ARTEFACTS_MOUNT)]


def convert_init_container(
    spec: ModelSpec, *, model_mounts: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """``packrat convert``: the engines' artefacts for the serving pod, found or converted
    under the profile's cache key and checked against eager with its gate (Guaranteed)."""
    if not spec.engines:
        return None
    target, _, _ = model_source(spec)
    sample: list[str] = []
    env = base_env()
    if spec.source.format == "mar" and spec.source.sample_request is not None:
        # a .mar's module is converted from the inputs its sample request gives it, as the
        # profiling Job converted it: without the request no pod could convert it itself
        sample = ["--sample-request-env", SAMPLE_REQUEST_ENV, "--sample-content-type"]
        sample.append(spec.source.sample_content_type or "application/octet-stream")
        env.append({"name": SAMPLE_REQUEST_ENV, "value": spec.source.sample_request})
    return {
        "name": "convert-engines",
        "image": spec.image,
        "command": [
            "packrat",
            "convert",
            "--model",
            target,
            "--engines",
            ",".join(spec.engines),
            "--artefacts",
            ARTEFACTS_DIR,
            "--threads",
            str(spec.cpus),
            *inputs_args(spec),
            *sample,
        ],
        "resources": guaranteed_resources(spec),
        "securityContext": container_security(),
        "env": env,
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            *model_mounts,
            dict(ARTEFACTS_MOUNT),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def serve_command(spec: ModelSpec) -> list[str]:
    target, _, _ = model_source(spec)
    return [
        "packrat",
        "serve",
        "--model",
        target,
        *inputs_args(spec),
        "--model-name",
        spec.model_name,
        "--plan-env",
        PLAN_ENV,
        "--admin-token-file",
        f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}",
        "--port",
        str(PORT),
        "--grpc-port",
        str(GRPC_PORT),
        "--host",
        "0.0.0.0",
        "--max-batch-delay-ms",
        str(spec.max_batch_delay_ms),
        *(["--batch-estimate", r] if (r := spec.rounding) != DEFAULT_ROUNDING else []),
        *request_log_args(spec.request_logging, namespace=spec.namespace, name=spec.name),
        *(["--runtime", spec.runtime] if spec.runtime else []),
        *(["--artefacts", ARTEFACTS_DIR] if spec.engines else []),
    ]


def serving_deployment(
    spec: ModelSpec,
    *,
    slot: str,
    serving_hash: str,
    replicas: int,
    plan_hash: str | None = None,
    limits: storage.StorageLimits = storage.DEFAULT_LIMITS,
) -> dict[str, Any]:
    """The Deployment of one slot, running ``packrat serve`` on the plan in the slot's plan
    ConfigMap, with the model's admin token (the in-pod switch). The plan is not in the
    template: a plan change that keeps the cores switches inside the running pods, and a pod
    that restarts starts on the ConfigMap's current plan. ``serving_hash`` is the template's
    (:meth:`packrat.controller.core.model.ModelSpec.template_hash`); ``plan_hash``, when
    given, is a pod annotation that restarts running pods when the plan they must start on
    changes."""
    owner = spec.owner()
    name = spec.name
    selector = {**base_labels(name), LABEL_SLOT: slot}
    pod_labels = {**selector, LABEL_MODEL: name, LABEL_SERVING_HASH: serving_hash}
    pod_spec = build_serving_pod_spec(spec, slot=slot, limits=limits)
    template_meta: dict[str, Any] = {
        "labels": dict(pod_labels),
        "annotations": scrape_annotations(),
    }
    if plan_hash is not None:
        template_meta["annotations"][ANNOTATION_PLAN_HASH] = plan_hash
    apply_pod(template_meta, pod_spec, thaw(spec.pod))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            **metadata(owner, name=deployment_name(name, slot), labels=pod_labels),
            "finalizers": [FINALIZER_SERVING],
        },
        "spec": {
            "replicas": int(replicas),
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_serving_pod_spec(
    spec: ModelSpec, *, slot: str, limits: storage.StorageLimits
) -> dict[str, Any]:
    """The serving pod of one slot, before the model's pod overrides (``spec.pod``): the
    serve container, the model's volumes, a fetch init container for a storageUri model."""
    name = spec.name
    _, model_volumes, model_mounts = model_source(spec, limits=limits)
    init: list[dict[str, Any]] = []
    fetch = fetch_init_container(spec, limits=limits)
    if fetch is not None:
        init.append(fetch)
    convert = convert_init_container(spec, model_mounts=model_mounts)
    if convert is not None:
        init.append(convert)
    engine_volumes, _ = engines_volume(spec, limits)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # the switch's drain happens before a slot is scaled down (the operator waits), so
        # the grace period covers only the preStop delay and in-flight requests: switch
        # timings stay out of the template, and changing them needs no switch
        "terminationGracePeriodSeconds": PRESTOP_SECONDS + 30,
        "securityContext": pod_security(),
        "containers": [build_serve_container(spec, slot=slot, model_mounts=model_mounts)],
        "volumes": [
            limits.tmp_volume(),  # bounded: issue 38
            *model_volumes,
            *engine_volumes,
            *storage.credentials_volume(thaw(spec.source.doc))[0],
            admin_token_volume(admin_token_name(name)),
        ],
        **scheduling(spec),
    }
    if init:
        pod_spec["initContainers"] = init
    return pod_spec


def build_serve_container(
    spec: ModelSpec, *, slot: str, model_mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ``serve`` container: ``packrat serve`` on the slot's plan ConfigMap, Guaranteed,
    non-root on a read-only root, probed on its dispatcher port."""
    return {
        "name": "serve",
        "image": spec.image,
        "command": serve_command(spec),
        "env": [
            *base_env(),
            _env_from(PLAN_ENV, "configMapKeyRef", plan_configmap_name(spec.name, slot), PLAN_KEY),
        ],
        "ports": [
            {"name": "http", "containerPort": PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        ],
        "resources": guaranteed_resources(spec),
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            *model_mounts,
            *([{**ARTEFACTS_MOUNT, "readOnly": True}] if spec.engines else []),
            admin_token_mount(),
        ],
        **_serve_probes(),
        # keep serving until every endpoint list dropped this pod, then drain
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _serve_probes() -> dict[str, Any]:
    probe_get = {"path": "/ping", "port": "http"}
    return {
        "startupProbe": {
            "httpGet": probe_get,
            "periodSeconds": 2,
            "failureThreshold": 300,
            "timeoutSeconds": 2,
        },
        "readinessProbe": {
            "httpGet": probe_get,
            "periodSeconds": 2,
            "failureThreshold": 2,
            "timeoutSeconds": 2,
        },
        # liveness is /healthz: /ping is 503 while a worker restarts or the pod drains,
        # which must take the pod out of the Service, not get it killed
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
            "timeoutSeconds": 5,
        },
    }


def _env_from(name: str, source: str, obj: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {source: {"name": obj, "key": key}}}


def service(owner: Mapping[str, Any], *, slot: str) -> dict[str, Any]:
    """The Service clients use; its selector includes the active slot."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name=name, labels={**base_labels(name), LABEL_MODEL: name}),
        "spec": {
            "type": "ClusterIP",
            "selector": service_selector(name, slot=slot),
            "ports": [
                {"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "grpc",  # h2c: gRPC without TLS, as meshes and Gateways read it
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
            ],
        },
    }


def service_selector(name: str, *, slot: str) -> dict[str, str]:
    return {**base_labels(name), LABEL_SLOT: slot}
