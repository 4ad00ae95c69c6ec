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

from packrat.controller.api.children import keep
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
    kept = keep(p.kube, "configmaps", p.namespace, want, ours=p.owns, drift=_plan_drift)
    if not kept.ours:
        p.conflict("ConfigMap", want["metadata"]["name"])
    return kept.ours


def _plan_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """The plan and its label annotation, when either differs."""
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    wanted = want["metadata"]["annotations"]
    if current.get("data") == want["data"] and (
        annotations.get(m.ANNOTATION_PLAN) == wanted[m.ANNOTATION_PLAN]
    ):
        return {}
    return {"metadata": {"annotations": wanted}, "data": want["data"]}
