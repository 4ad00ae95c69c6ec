"""Comparing what we set with what is there, and the patches that put it back.

``covers(actual, desired)``: every field we set has our value (maps: each of our keys;
lists: same length, element by element; quantities by value). Fields the API server
defaults or other controllers add are not drift, so a real API server's defaulting never
causes a patch loop, while ``kubectl set image``, an edited env or resources are. The merge
patch from ``merge_patch`` deletes keys (``null``) where the desired map has none, which a
plain ``{"selector": want}`` patch cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity ("4Gi", "500m", "1e3", "2Ei", "+1Gi", 2) as a number; None when
    it is not one. Parsed by the Kubernetes client's own ``parse_quantity`` (imported here,
    when two quantities are compared: importing the client costs seconds, and most passes
    compare none)."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return None


def covers(actual: Any, desired: Any, *, path: str = "") -> bool:
    """``actual`` has every field of ``desired`` with the same value."""
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(
            key in actual and covers(actual[key], value, path=f"{path}.{key}")
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return False
        return all(covers(a, d, path=path) for a, d in zip(actual, desired, strict=True))
    if actual == desired:
        return True
    if ".resources." in f"{path}." or path.startswith(".resources"):
        a, d = quantity(actual), quantity(desired)
        return a is not None and a == d
    return False


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    return patch
