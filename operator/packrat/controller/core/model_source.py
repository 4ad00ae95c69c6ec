"""The checks of ``spec.model`` only Python can make (pure): the schema and CEL rules of the CRD
(exactly one source, its format, names, patterns) are checked by
:mod:`packrat.controller.api.schema`; here the fetch's own URL parser reads a uri, the storage
fields are checked by :mod:`packrat.controller.core.storage`, and a mar model needs a sample
request (profiled through its own handler). :class:`ModelSource` is a valid ``spec.model``,
typed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.storage import validate_storage
from packrat.runtime.egress import EgressError, split_url
from packrat.runtime.inputs import InputsError, parse_inputs

# the file name's suffix each format is fetched to (the runtime loads a file by its suffix;
# the formats themselves: the CRD's spec.model.format enum)
FORMAT_SUFFIX = {"mar": ".mar", "torchscript": ".pt", "pt2": ".pt2", "onnx": ".onnx"}


def _fetchable(uri: str) -> bool:
    """Whether the fetch's one URL parser reads ``uri`` (no authority hiding a second host)."""
    try:
        split_url(uri)
    except EgressError:
        return False
    return True


def validate_model(errors: list[str], model: Any, *, where: str = "spec.model") -> None:
    """Append every problem with ``model`` (at ``where``) the CRD's schema cannot state."""
    if not isinstance(model, Mapping):
        return  # the schema check reports it
    uri = model.get("uri")
    if isinstance(uri, str) and not _fetchable(uri):
        errors.append(f"{where}.uri must be an http(s) URL with a plain host[:port], got {uri!r}")
    found: list[str] = []
    validate_storage(found, model)
    errors += [e.replace("spec.model", where) for e in found]
    if model.get("format") == "mar" and "sampleRequest" not in model:
        errors.append(
            f"{where}: a mar model needs model.sampleRequest (it is profiled through its own "
            "handler)"
        )
    _check_inputs(errors, model, where=where)


def _check_inputs(errors: list[str], model: Mapping[str, Any], *, where: str) -> None:
    """spec.model.inputs: a model file's inputs (KServe/Triton forms, or a sample v2
    request's inputs), for a file whose own description is missing or partial."""
    fmt = model.get("format")
    volume = model.get("volume")
    path = volume.get("path") if isinstance(volume, Mapping) else None
    suffix = FORMAT_SUFFIX.get(fmt) if isinstance(fmt, str) else None
    if fmt in ("pt2", "onnx") and isinstance(path, str) and not path.endswith(str(suffix)):
        errors.append(f"{where}.volume.path of a {fmt} model must end in {suffix}, got {path!r}")
    if "inputs" not in model:
        return
    if fmt not in ("torchscript", "pt2", "onnx"):
        errors.append(f"{where}.inputs applies to a torchscript, pt2 or onnx model file")
        return
    try:
        parse_inputs(model["inputs"])
    except InputsError as exc:
        errors.append(f"{where}.inputs: {exc}")


@dataclass(frozen=True, slots=True)
class ModelVolume:
    """``spec.model.volume``: a PersistentVolumeClaim or a ConfigMap, and the file's path."""

    claim: str | None
    config_map: str | None
    path: str


@dataclass(frozen=True)
class ModelSource:
    """``spec.model`` of a valid spec, typed once: exactly one of ``zoo``, ``uri``,
    ``storage_uri`` and ``volume`` is set. ``doc`` is the field as given (read-only): what
    hashes and profile keys are made of, and what a canary or a stage copies."""

    doc: Mapping[str, Any]
    zoo: str | None = None
    uri: str | None = None
    storage_uri: str | None = None
    volume: ModelVolume | None = None
    format: str | None = None
    name: str | None = None
    sample_request: str | None = None
    sample_content_type: str | None = None  # as given (None: application/octet-stream)
    credentials_secret: str | None = None
    inputs: Any = None  # spec.model.inputs as given (checked; packrat.runtime.inputs reads it)

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> ModelSource:
        volume = doc.get("volume")
        secret = doc.get("credentialsSecret")
        return cls(
            doc=doc,
            zoo=_opt(doc.get("zoo")),
            uri=_opt(doc.get("uri")),
            storage_uri=_opt(doc.get("storageUri")),
            volume=(
                ModelVolume(
                    claim=_opt((volume.get("persistentVolumeClaim") or {}).get("claimName")),
                    config_map=_opt((volume.get("configMap") or {}).get("name")),
                    path=str(volume["path"]),
                )
                if isinstance(volume, Mapping)
                else None
            ),
            format=_opt(doc.get("format")),
            name=_opt(doc.get("name")),
            sample_request=_opt(doc.get("sampleRequest")),
            sample_content_type=_opt(doc.get("sampleContentType")),
            credentials_secret=_opt(secret.get("name")) if isinstance(secret, Mapping) else None,
            inputs=doc.get("inputs"),
        )


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)
