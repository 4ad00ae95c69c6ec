"""Validation of ``spec.model``: exactly one source (zoo, uri, volume, storageUri), its format,
name and sample request (pure; the CRD enforces the same rules where an API server runs)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packrat.controller.core.storage import validate_storage
from packrat.runtime.egress import EgressError, split_url
from packrat.runtime.inputs import InputsError, parse_inputs

ZOO_MODELS = ("resnet50", "inception_v3", "bert-base", "gpt2", "tiny")
MODEL_FORMATS = ("mar", "torchscript", "pt2", "onnx")
# the file name's suffix each format is fetched to (the runtime loads a file by its suffix)
FORMAT_SUFFIX = {"mar": ".mar", "torchscript": ".pt", "pt2": ".pt2", "onnx": ".onnx"}
_CONTENT_TYPE_RE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+$")
_MODEL_FIELDS = {
    *("zoo", "uri", "volume", "storageUri", "credentialsSecret", "digest"),
    *("format", "name", "sampleRequest", "sampleContentType", "inputs"),
}
_VOLUME_FIELDS = {"persistentVolumeClaim", "configMap", "path"}
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PATH_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")


def _unknown(errors: list[str], obj: Mapping[str, Any], known: set[str], *, where: str) -> None:
    for key in sorted(set(obj) - known):
        errors.append(f"{where}{key}: unknown field")


def _fetchable(uri: str) -> bool:
    """Whether the fetch's one URL parser reads ``uri`` (no authority hiding a second host)."""
    try:
        split_url(uri)
    except EgressError:
        return False
    return True


def validate_model(errors: list[str], model: Any) -> None:
    if not isinstance(model, Mapping):
        errors.append("spec.model must be an object")
        return
    _unknown(errors, model, _MODEL_FIELDS, where="spec.model.")
    sources = [k for k in ("zoo", "uri", "volume", "storageUri") if k in model]
    if len(sources) != 1:
        errors.append(
            "exactly one of model.zoo, model.uri, model.volume and model.storageUri must be set"
            + (f" (got {', '.join(sources)})" if sources else "")
        )
    if "zoo" in model and model["zoo"] not in ZOO_MODELS:
        errors.append(
            f"spec.model.zoo must be one of {', '.join(ZOO_MODELS)}, got {model['zoo']!r}"
        )
    if "uri" in model:
        uri = model["uri"]
        if not (isinstance(uri, str) and len(uri) <= 2048 and _fetchable(uri)):
            errors.append(
                f"spec.model.uri must be an http(s) URL with a plain host[:port], got {uri!r}"
            )
    if "volume" in model:
        _check_volume(errors, model["volume"])
    validate_storage(errors, model)
    fmt = model.get("format")
    if "zoo" in model and fmt is not None:
        errors.append("model.format applies only to model.uri, model.volume and model.storageUri")
    if "zoo" not in model and sources and fmt is None:
        errors.append("model.format is required with model.uri, model.volume or model.storageUri")
    if fmt is not None and fmt not in MODEL_FORMATS:
        errors.append(f"spec.model.format must be one of {', '.join(MODEL_FORMATS)}, got {fmt!r}")
    _check_name_and_sample(errors, model, fmt=fmt)
    _check_inputs(errors, model, fmt=fmt)


def _check_inputs(errors: list[str], model: Mapping[str, Any], *, fmt: Any) -> None:
    """spec.model.inputs: a model file's inputs (KServe/Triton forms, or a sample v2
    request's inputs), for a file whose own description is missing or partial."""
    volume = model.get("volume")
    path = volume.get("path") if isinstance(volume, Mapping) else None
    suffix = FORMAT_SUFFIX.get(fmt) if isinstance(fmt, str) else None
    if fmt in ("pt2", "onnx") and isinstance(path, str) and not path.endswith(str(suffix)):
        errors.append(f"spec.model.volume.path of a {fmt} model must end in {suffix}, got {path!r}")
    if "inputs" not in model:
        return
    if fmt not in ("torchscript", "pt2", "onnx"):
        errors.append("spec.model.inputs applies to a torchscript, pt2 or onnx model file")
        return
    try:
        parse_inputs(model["inputs"])
    except InputsError as exc:
        errors.append(f"spec.model.inputs: {exc}")


def _check_volume(errors: list[str], volume: Any) -> None:
    """spec.model.volume: one PVC or ConfigMap, and a relative path inside it."""
    if not isinstance(volume, Mapping):
        errors.append("spec.model.volume must be an object")
        return
    _unknown(errors, volume, _VOLUME_FIELDS, where="spec.model.volume.")
    if ("persistentVolumeClaim" in volume) == ("configMap" in volume):
        errors.append("set exactly one of model.volume.persistentVolumeClaim and configMap")
    pvc = volume.get("persistentVolumeClaim")
    if pvc is not None and not (isinstance(pvc, Mapping) and pvc.get("claimName")):
        errors.append("spec.model.volume.persistentVolumeClaim.claimName is required")
    cm = volume.get("configMap")
    if cm is not None and not (isinstance(cm, Mapping) and cm.get("name")):
        errors.append("spec.model.volume.configMap.name is required")
    path = volume.get("path")
    if not isinstance(path, str) or not _PATH_RE.fullmatch(path) or ".." in path:
        errors.append(f"spec.model.volume.path must be a relative path without '..', got {path!r}")


def _check_name_and_sample(errors: list[str], model: Mapping[str, Any], *, fmt: Any) -> None:
    """spec.model.name, and the sample request a mar model is profiled with."""
    name = model.get("name")
    if name is not None and (
        not isinstance(name, str) or not _MODEL_NAME_RE.fullmatch(name) or len(name) > 63
    ):
        errors.append(f"spec.model.name must match {_MODEL_NAME_RE.pattern}, got {name!r}")
    sample = model.get("sampleRequest")
    if sample is not None and not isinstance(sample, str):
        errors.append("spec.model.sampleRequest must be a base64 string")
    if fmt == "mar" and sample is None:
        errors.append(
            "a mar model needs model.sampleRequest (it is profiled through its own handler)"
        )
    content_type = model.get("sampleContentType")
    if content_type is not None and (
        not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type)
    ):
        errors.append(f"spec.model.sampleContentType must be a type/subtype, got {content_type!r}")
