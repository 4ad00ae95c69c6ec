"""Whose object is it: the ownerReference check made before any write to a child.

A child is ours when one of its ownerReferences names this PackratModel (or, for a
pipeline's children, this PackratPipeline: ``kind``) (kind and uid; by
name when the owner has no uid, as in unit tests' fake API). An object under one of our
names that is not ours (a user's own Service, a leftover of a deleted model of the same
name) is a conflict: reported in the ``OwnershipConflict`` condition and a Warning event,
never adopted, edited or deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.crd import KIND, PIPELINE_KIND, POOL_KIND


def owned_by(obj: Mapping[str, Any], *, name: str, uid: str | None, kind: str = KIND) -> bool:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") != kind:
            continue
        if uid and ref.get("uid"):
            if ref.get("uid") == uid:
                return True
        elif ref.get("name") == name:
            return True
    return False


def conflict_message(conflicts: list[tuple[str, str]], *, owner: str = KIND) -> str:
    names = ", ".join(f"{kind} {name}" for kind, name in conflicts)
    verb = "is" if len(conflicts) == 1 else "are"
    what = {KIND: "model", PIPELINE_KIND: "pipeline", POOL_KIND: "pool"}[owner]
    return (
        f"{names} {verb} not owned by this {owner} and left untouched; "
        f"delete or rename it, or rename the {what}"
    )
