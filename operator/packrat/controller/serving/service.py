"""The model's Service: created if missing, its selector always exactly the active slot's.

A Service under the model's name that this model does not own is a conflict (never taken
over); one of ours whose selector, ports or labels drifted is patched back, extra selector
keys removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.drift import covers, merge_patch
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.serving import manifests as m


def ensure_service(p: Pass, current: Mapping[str, Any] | None, *, slot: str) -> bool:
    """Bring the Service to select ``slot``; False when it is not ours to change."""
    owner = {"metadata": {**p.obj["metadata"]}, "spec": {}}
    want = m.service(owner, slot=slot)
    if current is None:
        p.kube.create("services", p.namespace, want)
        return True
    uid = p.obj["metadata"].get("uid")
    if not owned_by(current, name=p.name, uid=uid):
        p.conflict("Service", p.name)
        return False
    spec = current.get("spec") or {}
    patch: dict[str, Any] = {}
    selector = spec.get("selector") or {}
    if selector != want["spec"]["selector"]:
        patch.setdefault("spec", {})["selector"] = merge_patch(selector, want["spec"]["selector"])
    if not covers(spec.get("ports"), want["spec"]["ports"]):
        patch.setdefault("spec", {})["ports"] = want["spec"]["ports"]
    labels = (current.get("metadata") or {}).get("labels") or {}
    if not covers(labels, want["metadata"]["labels"]):
        patch["metadata"] = {"labels": want["metadata"]["labels"]}
    if patch:
        p.kube.patch("services", p.namespace, p.name, patch)
    return True
