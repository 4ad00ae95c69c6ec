"""The model's Service: created if missing, its selector always exactly the active slot's.

A Service under the model's name that this model does not own is a conflict (never taken
over); one of ours whose selector, ports or labels drifted is patched back, extra selector
keys removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.api.children import keep, service_drift
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.serving import manifests as m


def ensure_service(p: Pass, current: Mapping[str, Any] | None, *, slot: str) -> bool:
    """Bring the Service to select ``slot``; False when it is not ours to change."""
    owner = {"metadata": {**p.obj["metadata"]}, "spec": {}}
    want = m.service(owner, slot=slot)
    kept = keep(
        p.kube, "services", p.namespace, want, current=current, ours=p.owns, drift=service_drift
    )
    if not kept.ours:
        p.conflict("Service", p.name)
    return kept.ours
