"""What a serving pod reads at start besides its template: the slot's plan ConfigMap (a pure
builder, and bringing it to what it should be) and the model's admin token Secret.

The plan lives in a ConfigMap per slot (``{model}-{slot}-plan``), read by the pod through a
``configMapKeyRef``: a plan change that keeps the cores leaves the Deployment's template as it
is (the in-pod switch posts the plan to the running pods), and a pod that starts or restarts
starts on the ConfigMap's plan. The ConfigMap is written before the Deployment it serves is
created or scaled, so a new pod never reads an older plan than its slot serves.

The admin token Secret (``{model}-admin-token``): :mod:`packrat.controller.serving.admin_token`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.plans import to_pod
from packrat.controller.serving import manifests as m
from packrat.plan.optimizer import Plan


def plan_configmap(owner: Mapping[str, Any], *, slot: str, plan: Plan) -> dict[str, Any]:
    """The slot's plan ConfigMap: the JSON ``packrat serve --plan-env`` reads."""
    name = owner["metadata"]["name"]
    labels = {**m.base_labels(name), m.LABEL_MODEL: name, m.LABEL_SLOT: slot}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            **m.metadata(owner, name=m.plan_configmap_name(name, slot), labels=labels),
            "annotations": {m.ANNOTATION_PLAN: plan.label},
        },
        "data": {m.PLAN_KEY: json.dumps(to_pod(plan), sort_keys=True)},
    }


def ensure_plan(p: Pass, *, slot: str, plan: Plan) -> bool:
    """Create the slot's plan ConfigMap or bring its plan back to ``plan``. False (and a
    conflict recorded) when a ConfigMap under that name is not ours: its plan, which someone
    else chose, must never reach a pod."""
    want = plan_configmap(p.obj, slot=slot, plan=plan)
    name = want["metadata"]["name"]
    current = p.kube.get("configmaps", p.namespace, name)
    if current is None:
        p.kube.create("configmaps", p.namespace, want)
        return True
    if not owned_by(current, name=p.name, uid=p.obj["metadata"].get("uid")):
        p.conflict("ConfigMap", name)
        return False
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if (
        current.get("data") != want["data"]
        or annotations.get(m.ANNOTATION_PLAN)
        != (want["metadata"]["annotations"][m.ANNOTATION_PLAN])
    ):
        p.kube.patch(
            "configmaps",
            p.namespace,
            name,
            {"metadata": {"annotations": want["metadata"]["annotations"]}, "data": want["data"]},
        )
    return True
