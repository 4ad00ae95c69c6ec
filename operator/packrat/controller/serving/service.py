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
    """Bring the Service to select ``slot``; False when it is not ours to change. A Service
    on a pool pod stays there until ``slot`` has a ready pod (a model leaving its pool)."""
    if hold_service(p, current, slot=slot):
        return True
    owner = {"metadata": {**p.obj["metadata"]}, "spec": {}}
    want = m.service(owner, slot=slot)
    kept = keep(
        p.kube, "services", p.namespace, want, current=current, ours=p.owns, drift=service_drift
    )
    if not kept.ours:
        p.conflict("Service", p.name)
    return kept.ours


def hold_service(p: Pass, current: Mapping[str, Any] | None, *, slot: str) -> bool:
    """Whether the Service must stay on the pool pod it selects (a model moving out of its
    pool: until its own ``slot`` has a ready pod); clears ``status.pool`` once it need not."""
    selector = ((current or {}).get("spec") or {}).get("selector") or {}
    if m.LABEL_POOL_POD not in selector:
        return False
    dep = p.kube.get("deployments", p.namespace, m.deployment_name(p.name, slot))
    if int(((dep or {}).get("status") or {}).get("readyReplicas") or 0) < 1:
        p.result.in_progress()
        return True
    p.status.set_pool(None)
    p.status.drop_condition("Placed")
    return False
