"""What the optional features' validators share: an optional object with known fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def known_object(
    errors: list[str], value: Any, *, where: str, fields: set[str]
) -> Mapping[str, Any] | None:
    """``value`` when it is an object, after a message for each of its unknown fields; None
    when it is absent (nothing to check) or not an object (a message says so)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errors.append(f"{where} must be an object")
        return None
    errors.extend(f"{where}.{k}: unknown field" for k in sorted(set(value) - fields))
    return value
