"""Pure builders for the profiling objects a PackratModel owns: the Job that measures its
profile and the ConfigMap that keeps the result for reuse (dict in, dict out)."""

from __future__ import annotations

import hashlib
from typing import Any

from packrat.controller.api.frozen import thaw
from packrat.controller.core import storage
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.overrides import apply_pod
from packrat.controller.serving.manifests import (
    ARTEFACTS_DIR,
    LABEL_MODEL,
    LABEL_PROFILE_KEY,
    PROFILE_DIR,
    PROFILE_FILE,
    PROFILING_APP,
    SAMPLE_REQUEST_ENV,
    base_env,
    base_labels,
    container_security,
    engines_volume,
    fetch_init_container,
    guaranteed_resources,
    inputs_args,
    metadata,
    model_source,
    pod_security,
    profile_object_name,
    scheduling,
)


def verify_batches(spec: ModelSpec) -> list[int]:
    """The batch sizes the profiling run verifies plans for (plan vs fat, measured): the
    fixed batch size, or every power of two autoBatch may choose; none with an SLO (the
    planner picks the replica size, not the profiled T) or ``profiling.verify: false``."""
    if not spec.profiling.verify or spec.slo is not None:
        return []
    if spec.batch_size is not None:
        return [spec.batch_size]
    if spec.auto is not None:
        lo, hi = spec.auto.min, spec.auto.max
        return [1 << k for k in range(11) if lo <= 1 << k <= hi]
    return []


def profile_command(spec: ModelSpec, *, output: str) -> list[str]:
    profiling = spec.profiling
    target, _, _ = model_source(spec)
    cmd = [
        "packrat",
        "profile",
        "--model",
        target,
        "--cpus",
        str(spec.cpus),
        "--max-batch",
        str(profiling.max_batch),
        "--precision",
        str(spec.spec["profiling"]["precision"]),  # as given: 0.02, or 1 (an int)
        "--time-budget",
        str(profiling.time_budget_seconds),
        "--mode",
        profiling.mode,
        "--progress-records",  # the operator reads them back from the log
        "on",
        "-o",
        output,
    ]
    if profiling.threads:
        cmd[8:8] = ["--threads", ",".join(str(t) for t in sorted(profiling.threads))]
    if profiling.allow_contended:
        cmd[-2:-2] = ["--allow-contended"]
    batches = verify_batches(spec)
    if batches:
        cmd[-2:-2] = ["--verify-batches", ",".join(str(b) for b in batches)]
    cmd[-2:-2] = inputs_args(spec)
    if spec.engines:  # converted and checked once here; a missing extra is left out, said
        cmd[-2:-2] = [
            "--engines",
            ",".join(spec.engines),
            "--missing-engines",
            "leave-out",
            "--artefacts",
            ARTEFACTS_DIR,
        ]
    if spec.source.sample_request is not None:
        cmd[-2:-2] = [
            "--sample-request-env",
            SAMPLE_REQUEST_ENV,
            "--sample-content-type",
            spec.source.sample_content_type or "application/octet-stream",
        ]
    return cmd


def profile_env(spec: ModelSpec) -> list[dict[str, Any]]:
    """The profile container's environment: the base one plus the sample request (base64)."""
    env = base_env()
    sample = spec.source.sample_request
    if sample is not None:
        env.append({"name": SAMPLE_REQUEST_ENV, "value": sample})
    return env


def profiling_job(
    spec: ModelSpec, *, limits: storage.StorageLimits = storage.DEFAULT_LIMITS
) -> dict[str, Any]:
    """The Job that measures the profile.

    The ``profile`` init container runs ``packrat profile`` on T exclusive cores; the main
    container ``publish`` prints the finished JSON, so the operator reads the profile from
    that container's log (the pod needs no API credentials). Both are Guaranteed-sized.
    """
    owner, name, key = spec.owner(), spec.name, spec.profile_key
    job_name = profile_object_name(name, key)
    labels = {
        **base_labels(name, app=PROFILING_APP),
        LABEL_MODEL: name,
        LABEL_PROFILE_KEY: key[:16],
    }
    pod_spec = build_profiling_pod_spec(spec, limits=limits)
    template_meta: dict[str, Any] = {"labels": dict(labels)}
    apply_pod(template_meta, pod_spec, thaw(spec.pod))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(owner, name=job_name, labels=labels),
        "spec": {
            "backoffLimit": spec.profiling.backoff_limit,
            "activeDeadlineSeconds": spec.profiling.timeout_seconds,
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_profiling_pod_spec(spec: ModelSpec, *, limits: storage.StorageLimits) -> dict[str, Any]:
    """The profiling pod, before the model's pod overrides: a fetch init container for a
    storageUri model, the ``profile`` init container, the ``publish`` container."""
    image = spec.image
    _, model_volumes, model_mounts = model_source(spec, limits=limits)
    output = f"{PROFILE_DIR}/{PROFILE_FILE}"
    engine_volumes, engine_mounts = engines_volume(spec, limits)
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "profile", "mountPath": PROFILE_DIR},
        *model_mounts,
        *engine_mounts,
    ]
    init: list[dict[str, Any]] = []
    fetch = fetch_init_container(spec, expect_version=True, limits=limits)
    if fetch is not None:
        init.append(fetch)
    init.append(
        {
            "name": "profile",
            "image": image,
            "command": profile_command(spec, output=output),
            "env": profile_env(spec),
            "resources": guaranteed_resources(spec),
            "securityContext": container_security(),
            "volumeMounts": mounts,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    )
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "initContainers": init,
        "containers": [
            {
                "name": "publish",
                "image": image,
                "command": ["cat", output],
                "resources": guaranteed_resources(spec),
                "securityContext": container_security(),
                "volumeMounts": [{"name": "profile", "mountPath": PROFILE_DIR, "readOnly": True}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            limits.tmp_volume(),  # bounded: issue 38
            {"name": "profile", "emptyDir": {"sizeLimit": "64Mi"}},
            *model_volumes,
            *engine_volumes,
            *storage.credentials_volume(thaw(spec.source.doc))[0],
        ],
        **scheduling(spec),
    }


def profile_configmap(spec: ModelSpec, *, profile_json: str, cpu_model: str = "") -> dict[str, Any]:
    """The ConfigMap that stores a measured profile for reuse (keyed by the profile key)."""
    owner, name, key = spec.owner(), spec.name, spec.profile_key
    labels = {
        **base_labels(name, app=PROFILING_APP),
        LABEL_MODEL: name,
        LABEL_PROFILE_KEY: key[:16],
    }
    meta = metadata(owner, name=profile_object_name(name, key), labels=labels)
    meta["annotations"] = {
        "packrat.dev/profile-key": key,
        "packrat.dev/profile-digest": hashlib.sha256(profile_json.encode()).hexdigest(),
        "packrat.dev/cpu-model": cpu_model,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {PROFILE_FILE: profile_json},
    }
