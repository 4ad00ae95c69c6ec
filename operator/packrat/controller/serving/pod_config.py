"""What a serving pod reads at start besides its template: the slot's plan ConfigMap and the
model's admin token Secret (pure builders, and bringing them to what they should be).

The plan lives in a ConfigMap per slot (``{model}-{slot}-plan``), read by the pod through a
``configMapKeyRef``: a plan change that keeps the cores leaves the Deployment's template as it
is (the in-pod switch posts the plan to the running pods), and a pod that starts or restarts
starts on the ConfigMap's plan. The ConfigMap is written before the Deployment it serves is
created or scaled, so a new pod never reads an older plan than its slot serves.

The admin token Secret (``{model}-admin-token``, random, made once by the operator) is the
bearer token of the pods' ``POST /admin/plan``: the operator reads it to switch the pods in
place, the pods get it through a ``secretKeyRef``. A Secret that is deleted is made again
with a new token: pods that started with the old one answer 401, and the operator falls back
to the Deployment switch, whose new pods start with the new token.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping
from typing import Any

from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.plans import to_pod
from packrat.controller.serving import manifests as m
from packrat.plan.optimizer import Plan

TOKEN_BYTES = 32


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


def admin_token_secret(owner: Mapping[str, Any], *, token: str) -> dict[str, Any]:
    """The model's admin token Secret holding ``token``."""
    name = owner["metadata"]["name"]
    labels = {**m.base_labels(name), m.LABEL_MODEL: name}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": m.metadata(owner, name=m.admin_token_name(name), labels=labels),
        "data": {m.ADMIN_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def secret_token(secret: Mapping[str, Any]) -> str | None:
    """The token a Secret holds (None when it holds none, or junk)."""
    raw = (secret.get("data") or {}).get(m.ADMIN_TOKEN_KEY)
    if not isinstance(raw, str):
        return None
    try:
        token = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return token if len(token.strip()) >= 16 else None


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


def ensure_token(p: Pass) -> str | None:
    """The model's admin token, its Secret made when missing (None: ours holds no token, or
    the Secret under that name is not ours: then a conflict is recorded, as a token someone
    else knows must never guard the pods)."""
    name = m.admin_token_name(p.name)
    current = p.kube.get("secrets", p.namespace, name)
    if current is None:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if p.kube.create("secrets", p.namespace, admin_token_secret(p.obj, token=token)):
            return token
        current = p.kube.get("secrets", p.namespace, name)  # made meanwhile
        if current is None:
            return None
    if not owned_by(current, name=p.name, uid=p.obj["metadata"].get("uid")):
        p.conflict("Secret", name)
        return None
    return secret_token(current)
