"""The PackratModel spec in Python: defaults, validation and the keys derived from it.

The CRD (``crds/packratmodel.yaml``) enforces types, bounds and, through CEL, the cross-field
rules. CEL only runs inside a real API server, and the operator must not trust that a stored
object passed it (CRD updated later, validation disabled, an emulator in tests), so the same
rules live here as a pure function: the handlers refuse an invalid spec with a clear
condition and create nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, TypeGuard, cast

from packrat.controller.api.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from packrat.controller.core.model_source import MODEL_FORMATS, ZOO_MODELS, validate_model
from packrat.controller.core.options.canary import validate_canary
from packrat.controller.core.options.request_logging import validate_request_logging
from packrat.controller.core.overrides import validate_pod
from packrat.controller.core.slo_spec import validate_slo, with_slo_defaults
from packrat.controller.core.storage import storage_identity
from packrat.runtime.inputs import InputsError, encode, parse_inputs

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "MODEL_FORMATS",
    "PLURAL",
    "VERSION",
    "ZOO_MODELS",
    "digest",
    "model_digest",
    "model_identity",
    "model_name",
    "read_spec",
    "validate_spec",
]


DEFAULT_IMAGE = "ghcr.io/packrat-operator/serving:0.1.0"
MAX_NAME_LENGTH = 40

DEFAULTS: dict[str, Any] = {
    "memory": "4Gi",
    "replicas": 1,
    "maxBatchDelayMs": 5,
    "profiling": {
        "maxBatch": 32,
        "precision": 0.02,
        "timeBudgetSeconds": 600,
        "timeoutSeconds": 1800,
        "backoffLimit": 2,
        "mode": "co-located",
    },
    "switch": {"readyTimeoutSeconds": 300, "drainSeconds": 10},
}
# How the pods round their mean queue depth to a power of two (packrat serve --batch-estimate);
# the pods' default ("nearest") is left out of pod commands and hashes, so it rolls no pods.
ESTIMATE_ROUNDINGS = ("floor", "nearest")
DEFAULT_ROUNDING = "nearest"  # packrat.plan.estimator.SERVING_ROUNDING (a unit test pins it)
# What runs the serving pods' plan instances (packrat serve --runtime); unset: the pods'
# default (packrat.serve.config.DEFAULT_RUNTIME), left out of pod commands and hashes.
RUNTIMES = ("native", "torchserve")
# spec.engines: the engines the profiling Job converts, checks against eager and profiles
# (packrat profile --engines); unset: eager only, the pods' form and hashes of before. "all"
# (alone): every engine installed in the image. packrat.runtime.engines.ENGINES (a unit test
# pins it).
ENGINES = ("eager", "inductor", "onnxruntime", "openvino")
ALL_ENGINES = "all"


AUTO_BATCH_DEFAULTS: dict[str, Any] = {
    "min": 1,
    "max": 32,
    "sustainObservations": 3,
    "minIntervalSeconds": 60,
    "minGain": 0.05,
    "sustainSeconds": 1,
}

_POOL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# Known fields per object, for rejecting unknown ones (the API server prunes/rejects them).
_SPEC_FIELDS = {
    "model",
    "image",
    "cpus",
    "memory",
    "replicas",
    "batchSize",
    "autoBatch",
    "maxBatchDelayMs",
    "profiling",
    "nodeSelector",
    "tolerations",
    "affinity",
    "switch",
    "slo",
    "autoscaling",
    "pod",
    "requestLogging",
    "canary",
    "runtime",
    "pool",
    "engines",
    "artefactsClaim",
}
_PROFILING_FIELDS = {
    "maxBatch",
    "threads",
    "precision",
    "timeBudgetSeconds",
    "timeoutSeconds",
    "backoffLimit",
    "allowContended",
    "verify",
    "mode",
}
# spec.profiling.mode: how each profile point is measured (packrat.plan.profile.MODES)
PROFILING_MODES = ("co-located", "alone")
_SWITCH_FIELDS = {"readyTimeoutSeconds", "drainSeconds"}
_TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_MEMORY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_DNS_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _with_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with the CRD's defaults filled in (what a real API server stores); only
    :func:`read_spec` calls it."""
    out = copy.deepcopy(dict(spec))
    for key, value in DEFAULTS.items():
        if isinstance(value, dict):
            given = out.get(key)
            if given is None:
                out[key] = dict(value)
            elif isinstance(given, Mapping):
                out[key] = {**value, **given}
            # anything else stays as given, for validation to report
        else:
            out.setdefault(key, value)
    auto = out.get("autoBatch")
    if isinstance(auto, Mapping):
        out["autoBatch"] = {**AUTO_BATCH_DEFAULTS, **auto}
    with_slo_defaults(out)
    return out


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(
    errors: list[str], obj: Mapping[str, Any], key: str, *, where: str, lo: int, hi: int
) -> None:
    if key not in obj:
        return
    value = obj[key]
    if not _is_int(value) or not lo <= value <= hi:
        errors.append(f"{where}{key} must be an integer in {lo}..{hi}, got {value!r}")


def _unknown(errors: list[str], obj: Mapping[str, Any], known: set[str], *, where: str) -> None:
    for key in sorted(set(obj) - known):
        errors.append(f"{where}{key}: unknown field")


def read_spec(raw: Any, *, name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The one defaulter: ``raw`` with the CRD's defaults filled in, and every problem with
    it as messages (empty when valid). :mod:`packrat.controller.core.model` types the result;
    nothing else defaults a spec.

    Mirrors the CRD: types, bounds, unknown fields and the CEL cross-field rules (exactly one
    model source, format with uri/volume, batchSize XOR autoBatch, batch within the profiled
    range, profiled threads within cpus).
    """
    errors: list[str] = []
    if name is not None and (len(name) > MAX_NAME_LENGTH or not _DNS_LABEL_RE.fullmatch(name)):
        errors.append(
            f"metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters "
            f"starting with a letter, got {name!r}"
        )
    if not isinstance(raw, Mapping):
        return {}, [*errors, "spec must be an object"]
    spec = _with_defaults(raw)
    _check(errors, spec)
    return spec, errors


def validate_spec(raw: Any, *, name: str | None = None) -> list[str]:
    """Every problem with ``raw`` (after defaulting), as messages; empty when valid."""
    return read_spec(raw, name=name)[1]


def _check(errors: list[str], spec: dict[str, Any]) -> None:
    """Every problem with a defaulted spec, appended to ``errors`` field by field."""
    _check_top_level(errors, spec)
    profiling = _check_profiling(errors, spec)
    _check_batching(errors, spec, max_batch=profiling.get("maxBatch"))
    _check_switch(errors, spec)
    _check_placement(errors, spec)
    validate_pod(errors, spec.get("pod"))


def _check_top_level(errors: list[str], spec: dict[str, Any]) -> None:
    """The model, its cores and sizes, runtime, memory and image."""
    _unknown(errors, spec, _SPEC_FIELDS, where="spec.")
    if "model" not in spec:
        errors.append("spec.model is required")
    else:
        validate_model(errors, spec["model"])
    if "cpus" not in spec:
        errors.append("spec.cpus is required")
    _int_in(errors, spec, "cpus", where="spec.", lo=1, hi=256)
    _int_in(errors, spec, "replicas", where="spec.", lo=0, hi=100)
    _int_in(errors, spec, "batchSize", where="spec.", lo=1, hi=1024)
    _int_in(errors, spec, "maxBatchDelayMs", where="spec.", lo=0, hi=10000)
    pool = spec.get("pool")
    if pool is not None and not (isinstance(pool, str) and _POOL_RE.fullmatch(pool)):
        errors.append(f"spec.pool must name a PackratPool (a DNS label), got {pool!r}")
    runtime = spec.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        errors.append(f"spec.runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    _check_engines(errors, spec.get("engines"), runtime=runtime)
    _check_artefacts_claim(errors, spec)
    memory = spec.get("memory")
    if not isinstance(memory, str) or not _MEMORY_RE.fullmatch(memory):
        errors.append(f"spec.memory must be a quantity such as 4Gi, got {memory!r}")
    image = spec.get("image")
    if image is not None and (not isinstance(image, str) or not image or len(image) > 512):
        errors.append("spec.image must be a non-empty string")


def _check_engines(errors: list[str], engines: Any, *, runtime: Any) -> None:
    """spec.engines: known names without repeats, or ["all"]; not with TorchServe."""
    if engines is None:
        return
    names = (*ENGINES, ALL_ENGINES)
    if (
        not isinstance(engines, list)
        or not 1 <= len(engines) <= len(names)
        or any(e not in names for e in engines)
        or len(set(engines)) != len(engines)
        or (ALL_ENGINES in engines and len(engines) > 1)
    ):
        errors.append(
            f"spec.engines must be a list of {', '.join(ENGINES)} without repeats, "
            f"or [all], got {engines!r}"
        )
    elif runtime == "torchserve" and engines != ["eager"]:
        errors.append("spec.engines other than eager need the native runtime (spec.runtime)")


def _check_artefacts_claim(errors: list[str], spec: Mapping[str, Any]) -> None:
    """spec.artefactsClaim: a claim name, for engines beyond eager."""
    claim = spec.get("artefactsClaim")
    if claim is None:
        return
    if not isinstance(claim, str) or len(claim) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(claim):
        errors.append(f"spec.artefactsClaim must be a PersistentVolumeClaim name, got {claim!r}")
    elif spec.get("engines") in (None, ["eager"]):
        errors.append("spec.artefactsClaim needs spec.engines beyond eager (nothing to convert)")


def _check_profiling(errors: list[str], spec: dict[str, Any]) -> Mapping[str, Any]:
    """spec.profiling; returns it ({} when it is not an object) for the checks against it."""
    profiling = spec["profiling"]
    if not isinstance(profiling, Mapping):
        errors.append("spec.profiling must be an object")
        profiling = {}
    _unknown(errors, profiling, _PROFILING_FIELDS, where="spec.profiling.")
    _int_in(errors, profiling, "maxBatch", where="spec.profiling.", lo=1, hi=1024)
    _int_in(errors, profiling, "timeBudgetSeconds", where="spec.profiling.", lo=1, hi=86400)
    _int_in(errors, profiling, "timeoutSeconds", where="spec.profiling.", lo=30, hi=172800)
    _int_in(errors, profiling, "backoffLimit", where="spec.profiling.", lo=0, hi=10)
    for flag in ("allowContended", "verify"):
        value = profiling.get(flag)
        if value is not None and not isinstance(value, bool):
            errors.append(f"spec.profiling.{flag} must be a boolean, got {value!r}")
    mode = profiling.get("mode")
    if mode not in PROFILING_MODES:
        errors.append(
            f"spec.profiling.mode must be one of {', '.join(PROFILING_MODES)}, got {mode!r}"
        )
    precision = profiling.get("precision")
    if (
        isinstance(precision, bool)
        or not isinstance(precision, int | float)
        or not (0 < precision <= 1)
    ):
        errors.append(f"spec.profiling.precision must be in (0, 1], got {precision!r}")
    _check_profiling_threads(errors, spec, profiling)
    return cast("Mapping[str, Any]", profiling)


def _check_profiling_threads(
    errors: list[str], spec: dict[str, Any], profiling: Mapping[str, Any]
) -> None:
    threads = profiling.get("threads")
    if threads is not None:
        if (
            not isinstance(threads, list)
            or not threads
            or not all(_is_int(t) and 1 <= t <= 256 for t in threads)
        ):
            errors.append(
                f"spec.profiling.threads must be a list of integers 1..256, got {threads!r}"
            )
        elif len(set(threads)) != len(threads):
            errors.append("spec.profiling.threads must not repeat a value")
        elif _is_int(spec.get("cpus")) and any(t > spec["cpus"] for t in threads):
            errors.append("every profiling.threads entry must be at most cpus")


def _check_batching(errors: list[str], spec: dict[str, Any], *, max_batch: Any) -> None:
    """How the batch is chosen (batchSize, autoBatch or an SLO), with the features that
    depend on it; ``max_batch``: spec.profiling.maxBatch as given."""
    has_batch = "batchSize" in spec
    has_auto = "autoBatch" in spec
    if has_batch == has_auto and "slo" not in spec:
        errors.append("exactly one of batchSize and autoBatch must be set")
    validate_slo(errors, spec)
    validate_request_logging(errors, spec)
    validate_canary(errors, spec)
    if (
        has_batch
        and _is_int(spec["batchSize"])
        and _is_int(max_batch)
        and spec["batchSize"] > max_batch
    ):
        errors.append(
            f"batchSize {spec['batchSize']} must not exceed profiling.maxBatch {max_batch}"
        )
    if has_auto:
        _check_auto_batch(errors, spec["autoBatch"], max_batch=max_batch)


def _check_auto_batch(errors: list[str], auto: Any, *, max_batch: Any) -> None:
    if not isinstance(auto, Mapping):
        errors.append("spec.autoBatch must be an object")
    else:
        _unknown(errors, auto, {*AUTO_BATCH_DEFAULTS, "rounding"}, where="spec.autoBatch.")
        rounding = auto.get("rounding", DEFAULT_ROUNDING)
        if rounding not in ESTIMATE_ROUNDINGS:
            errors.append(
                f"spec.autoBatch.rounding must be one of {', '.join(ESTIMATE_ROUNDINGS)}, "
                f"got {rounding!r}"
            )
        _int_in(errors, auto, "min", where="spec.autoBatch.", lo=1, hi=1024)
        _int_in(errors, auto, "max", where="spec.autoBatch.", lo=1, hi=1024)
        _int_in(errors, auto, "sustainObservations", where="spec.autoBatch.", lo=1, hi=100)
        _int_in(errors, auto, "minIntervalSeconds", where="spec.autoBatch.", lo=0, hi=86400)
        held = auto.get("sustainSeconds")
        if isinstance(held, bool) or not isinstance(held, int | float) or not 0 <= held <= 60:
            errors.append(
                f"spec.autoBatch.sustainSeconds must be a number in [0, 60], got {held!r}"
            )
        gain = auto.get("minGain")
        if isinstance(gain, bool) or not isinstance(gain, int | float) or not 0 <= gain <= 1:
            errors.append(f"spec.autoBatch.minGain must be a number in [0, 1], got {gain!r}")
        lo, hi = auto.get("min"), auto.get("max")
        if _is_int(lo) and _is_int(hi) and lo > hi:
            errors.append("autoBatch.min must not exceed autoBatch.max")
        if _is_int(hi) and _is_int(max_batch) and hi > max_batch:
            errors.append(f"autoBatch.max {hi} must not exceed profiling.maxBatch {max_batch}")


def _check_switch(errors: list[str], spec: dict[str, Any]) -> None:
    switch = spec["switch"]
    if not isinstance(switch, Mapping):
        errors.append("spec.switch must be an object")
    else:
        _unknown(errors, switch, _SWITCH_FIELDS, where="spec.switch.")
        _int_in(errors, switch, "readyTimeoutSeconds", where="spec.switch.", lo=5, hi=3600)
        _int_in(errors, switch, "drainSeconds", where="spec.switch.", lo=0, hi=600)


def _check_placement(errors: list[str], spec: dict[str, Any]) -> None:
    """Where the pods may run: nodeSelector, tolerations, affinity."""
    selector = spec.get("nodeSelector")
    if selector is not None and not (
        isinstance(selector, Mapping) and all(isinstance(v, str) for v in selector.values())
    ):
        errors.append("spec.nodeSelector must map strings to strings")
    tolerations = spec.get("tolerations")
    if tolerations is not None:
        if not isinstance(tolerations, list) or not all(
            isinstance(t, Mapping) for t in tolerations
        ):
            errors.append("spec.tolerations must be a list of objects")
        else:
            for i, tol in enumerate(tolerations):
                _unknown(errors, tol, _TOLERATION_FIELDS, where=f"spec.tolerations[{i}].")
    affinity = spec.get("affinity")
    if affinity is not None and not isinstance(affinity, Mapping):
        errors.append("spec.affinity must be an object")


# -- derived values (typed ones are on ModelSpec, :mod:`packrat.controller.core.model`) --------
def model_name(spec: Mapping[str, Any], *, default: str) -> str:
    """The name in ``/predictions/{name}``."""
    return str(spec["model"].get("name") or default)


def model_identity(model: Mapping[str, Any]) -> str:
    """A stable description of the model's source, used in the profile key.

    Zoo models are fixed by name (architecture and seed are in the image); a uri or volume
    model by its location; a storageUri model also by its digest or the store's version of
    the object, so one replaced under the same URI is re-profiled. A uri or volume file
    replaced in place is not detected: change the location to re-profile. Declared inputs
    (``spec.model.inputs``) are part of it: other inputs are another profile.
    """
    inputs = model.get("inputs")
    base = _source_identity(model)
    if inputs is None:
        return base
    try:
        canonical = encode(parse_inputs(inputs))  # the same inputs in any form: one profile
    except InputsError:
        canonical = repr(inputs)  # an invalid spec is refused before it is profiled
    return f"{base}:inputs:{digest(canonical)[:16]}"


def _source_identity(model: Mapping[str, Any]) -> str:
    if "zoo" in model:
        return f"zoo:{model['zoo']}"
    if "uri" in model:
        return f"uri:{model['uri']}:{model.get('format')}"
    if "storageUri" in model:
        return storage_identity(model)
    volume = model.get("volume", {})
    source = (
        f"pvc:{volume['persistentVolumeClaim']['claimName']}"
        if "persistentVolumeClaim" in volume
        else f"cm:{volume.get('configMap', {}).get('name')}"
    )
    return f"volume:{source}:{volume.get('path')}:{model.get('format')}"


def digest(data: Any) -> str:
    """sha256 of ``data``'s canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def model_digest(spec: Mapping[str, Any]) -> str:
    """sha256 of the model identity (labels carry its first 16 hex digits)."""
    return digest(model_identity(spec["model"]))
