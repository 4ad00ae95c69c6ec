"""The PackratModel spec in Python: defaults, validation and the keys derived from it.

The CRD (``crds/packratmodel.yaml``) states types, bounds and, through CEL, the cross-field
rules. CEL only runs inside a real API server, and the operator must not trust that a stored
object passed it (CRD updated later, validation disabled, an emulator in tests), so
:func:`read_spec` checks the spec against the CRD's own schema and rules
(:mod:`packrat.controller.api.schema`) and then makes the checks only Python can: the handlers
refuse an invalid spec with a clear condition and create nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from packrat.controller.api.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from packrat.controller.api.schema import MODEL_CRD, schema_check, schema_defaults
from packrat.controller.core.model_source import validate_model
from packrat.controller.core.options.canary import validate_canary
from packrat.controller.core.options.request_logging import validate_request_logging
from packrat.controller.core.overrides import explain_not_allowed, validate_pod
from packrat.controller.core.slo_spec import validate_slo, with_slo_defaults
from packrat.controller.core.storage import storage_identity
from packrat.runtime.inputs import InputsError, encode, parse_inputs

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
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
# How the pods round their mean queue depth to a power of two (packrat serve --batch-estimate;
# the choices: the CRD's spec.autoBatch.rounding enum); the pods' default ("nearest") is left
# out of pod commands and hashes, so it rolls no pods.
DEFAULT_ROUNDING = "nearest"  # packrat.plan.estimator.SERVING_ROUNDING (a unit test pins it)
# spec.engines: the engines the profiling Job converts, checks against eager and profiles
# (packrat profile --engines); unset: eager only, the pods' form and hashes of before. "all"
# (alone): every engine installed in the image. packrat.runtime.engines.ENGINES (a unit test
# pins it); the CRD's enum checks a spec's names.
ENGINES = ("eager", "inductor", "onnxruntime", "openvino")
ALL_ENGINES = "all"


AUTO_BATCH_DEFAULTS: dict[str, Any] = schema_defaults(MODEL_CRD, "spec", "autoBatch")

_DNS_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


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


def read_spec(raw: Any, *, name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The one defaulter: ``raw`` with the CRD's defaults filled in, and every problem with
    it as messages (empty when valid). :mod:`packrat.controller.core.model` types the result;
    nothing else defaults a spec.

    Checks the CRD's schema (types, bounds, enums, patterns, unknown fields) and its CEL
    cross-field rules (exactly one model source, format with uri/volume, batchSize XOR
    autoBatch, batch within the profiled range, profiled threads within cpus), then the
    rules only Python can check.
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
    """Every problem with a defaulted spec: the CRD's schema and CEL rules, then the checks
    only Python can make (URL parsers, object names, sums over fields)."""
    more: list[str] = []
    validate_model(more, spec.get("model"))
    validate_slo(more, spec)
    validate_request_logging(more, spec)
    validate_canary(more, spec)
    validate_pod(more, spec.get("pod"))
    _check_engines(more, spec)
    found = schema_check(MODEL_CRD, "spec").errors(spec, "spec", extra=more)
    errors += [explain_not_allowed(message) for message in found]


def _check_engines(errors: list[str], spec: Mapping[str, Any]) -> None:
    """spec.engines where the CRD cannot say it: engines beyond eager need the native
    runtime."""
    engines = spec.get("engines")
    if spec.get("runtime") == "torchserve" and engines not in (None, ["eager"]):
        errors.append("spec.engines other than eager need the native runtime (spec.runtime)")


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
