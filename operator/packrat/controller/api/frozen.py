"""Read-only views of JSON-like data, and plain data back from them.

A model's spec is kept as a read-only view (:func:`freeze`), so no reconcile step can change
what another one reads; the builders copy what they put into manifests and status
(:func:`thaw`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


def freeze(value: Any) -> Any:
    """A read-only view of JSON-like data (every mapping a ``MappingProxyType``)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return [freeze(v) for v in value]
    return value


def thaw(value: Any) -> Any:
    """Plain, mutable JSON data from a (partly) frozen view (for manifests and status)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
