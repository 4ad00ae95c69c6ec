"""The checks of ``spec.model`` only Python can make (pure): the schema and CEL rules of the CRD
(exactly one source, its format, names, patterns) are checked by
:mod:`packrat.controller.api.schema`; here the fetch's own URL parser reads a uri, the storage
fields are checked by :mod:`packrat.controller.core.storage`, and a mar model needs a sample
request (profiled through its own handler)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.core.storage import validate_storage
from packrat.runtime.egress import EgressError, split_url


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
