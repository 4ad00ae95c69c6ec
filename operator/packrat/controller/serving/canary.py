"""The canary's objects (pure builders): its Deployment is a serving slot named ``canary``
(``{model}-canary``, plan ConfigMap ``{model}-canary-plan``) running the canary's model on the
active slot's plan and cores, and its own Service ``{model}-canary``, which only the stable
pods' dispatchers call (the model's Service never selects the canary slot)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packrat.controller.core.options.canary import CanarySettings
from packrat.controller.serving import manifests as m
from packrat.controller.serving.slots import Rendering

SLOT = "canary"


def canary_name(name: str) -> str:
    """The canary's Deployment and Service."""
    return m.deployment_name(name, SLOT)


def canary_rendering(good: Rendering, canary: CanarySettings) -> Rendering:
    """What the canary serves: the active slot's spec and plan with the canary's model."""
    spec = good.spec.with_spec(model=dict(canary.model))
    return Rendering(spec=spec, plan=good.plan, serving_hash=spec.serving_hash(good.plan))


def canary_service(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The canary's Service: selects the canary slot's pods."""
    name = owner["metadata"]["name"]
    service = m.service(owner, slot=SLOT)
    service["metadata"] = m.metadata(
        owner, name=canary_name(name), labels={**m.base_labels(name), m.LABEL_MODEL: name}
    )
    return service


def canary_url(service_url: str, rendering: Rendering) -> str:
    """Where the stable pods send the canary's share: its Service, its model's predictions."""
    spec = rendering.spec
    base = service_url.format(service=canary_name(spec.name), namespace=spec.namespace)
    return f"{base.rstrip('/')}/predictions/{spec.model_name}"
