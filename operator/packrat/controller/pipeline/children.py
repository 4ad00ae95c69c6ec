"""What a PackratPipeline owns, observed and brought to what it should be.

Children: one PackratModel per stage (``<pipeline>-<stage>``), the router's ConfigMap and
Deployment (``<pipeline>-router``) and the pipeline's Service (``<pipeline>``). Each is
created when missing and patched back when what the pipeline sets drifted (fields the API
server defaults or other controllers add are not drift:
:func:`packrat.controller.api.drift.covers`).
An object under one of these names that the pipeline does not own (no controller
ownerReference to this PackratPipeline's uid) is a conflict: never adopted, edited or deleted.
A stage model of this pipeline whose stage left the spec is deleted (its own children go with
it, by the garbage collector). With ``spec.autoscaling.mode: external`` a stage model's
``spec.replicas`` belongs to whoever scales it (an HPA, KEDA) once it serves: the pipeline
sets it when it creates the model and when its plan first arrives, never after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.children import Outcome, keep, labels_drift, service_drift
from packrat.controller.api.drift import covers, merge_patch
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import PipelinePass as Pass
from packrat.controller.core.model import PROFILE_ONLY_ANNOTATION, SERVING_CPUS_ANNOTATION
from packrat.controller.core.spec import read_spec
from packrat.controller.pipeline import manifests as pm
from packrat.controller.pipeline.spec import PipelineObject
from packrat.controller.serving.admin_token import Holder, ensure_token
from packrat.controller.serving.manifests import router_token_name

ROUTER_REPLICAS = 2


@dataclass(frozen=True, slots=True)
class StageTarget:
    """What one stage model should serve."""

    batch: int
    replicas: int
    serving_cpus: int | None  # None: no plan yet (the stage model only profiles)
    autoscaling: Mapping[str, Any] | None = None  # the stage model's spec.autoscaling

    @property
    def external(self) -> bool:
        return (self.autoscaling or {}).get("mode") == "external"


@dataclass
class PipelineChildren:
    """Every object a pipeline owns (or would), read at the start of the pass."""

    models: dict[str, dict[str, Any] | None]  # stage name -> its PackratModel
    leftovers: list[dict[str, Any]]  # this pipeline's stage models of stages no longer in spec
    configmap: dict[str, Any] | None
    deployment: dict[str, Any] | None
    service: dict[str, Any] | None


def observe(p: Pass, pipe: PipelineObject) -> PipelineChildren:
    kube, ns = p.kube, p.namespace
    models = {s.name: kube.get("packratmodels", ns, s.model_name) for s in pipe.stages}
    wanted = {s.model_name for s in pipe.stages}
    leftovers = [
        obj
        for obj in kube.list("packratmodels", ns, labels={pm.LABEL_PIPELINE: pipe.name})
        if obj["metadata"]["name"] not in wanted
    ]
    router = pm.router_name(pipe.name)
    return PipelineChildren(
        models=models,
        leftovers=leftovers,
        configmap=kube.get("configmaps", ns, router),
        deployment=kube.get("deployments", ns, router),
        service=kube.get("services", ns, pipe.name),
    )


def ours(p: Pass, obj: Mapping[str, Any]) -> bool:
    return owned_by(obj, name=p.name, uid=p.obj["metadata"].get("uid"), kind=pm.PIPELINE_KIND)


def find_conflicts(p: Pass, pipe: PipelineObject, children: PipelineChildren) -> None:
    """Record every object under one of the pipeline's names that is not the pipeline's."""
    router = pm.router_name(pipe.name)
    found = [
        *(("PackratModel", s.model_name, children.models[s.name]) for s in pipe.stages),
        ("ConfigMap", router, children.configmap),
        ("Deployment", router, children.deployment),
        ("Service", pipe.name, children.service),
    ]
    for kind, name, obj in found:
        if obj is not None and not ours(p, obj):
            p.conflict(kind, name)


def remove_leftovers(p: Pass, children: PipelineChildren) -> None:
    for obj in children.leftovers:
        if not ours(p, obj):
            continue  # a label alone does not make it ours
        name = obj["metadata"]["name"]
        if p.kube.delete("packratmodels", p.namespace, name):
            p.emit("Normal", "StageRemoved", f"stage model {name} deleted: its stage left the spec")


def ensure_stage(
    p: Pass,
    pipe: PipelineObject,
    stage: str,
    current: Mapping[str, Any] | None,
    target: StageTarget,
) -> bool:
    """Create or patch one stage model; True when it already matched (nothing written)."""
    spec = pipe.stage(stage)
    want = pm.stage_model(
        pipe.owner(),
        stage=stage,
        model=spec.model.spec,
        batch=target.batch,
        replicas=target.replicas,
        serving_cpus=target.serving_cpus,
        autoscaling=target.autoscaling,
    )
    meta = (current or {}).get("metadata") or {}
    have_notes = meta.get("annotations") or {}
    if current is not None and target.external and PROFILE_ONLY_ANNOTATION not in have_notes:
        # serving: its replica count is the external scaler's
        want["spec"]["replicas"] = (current.get("spec") or {}).get("replicas", target.replicas)
    kept = keep(
        p.kube, "packratmodels", p.namespace, want, current=current, ours=p.owns, drift=_stage_drift
    )
    if kept.created:
        p.emit("Normal", "StageCreated", f"stage {stage}: PackratModel {spec.model_name}")
    return kept.outcome is Outcome.KEPT


def _stage_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """A stage model's spec as read (defaults applied), our annotations, our labels."""
    patch: dict[str, Any] = {}
    have_spec = current.get("spec") or {}
    want_spec = read_spec(want["spec"])[0]
    if read_spec(have_spec)[0] != want_spec:
        patch["spec"] = merge_patch(have_spec, want_spec)
    have_notes = (current.get("metadata") or {}).get("annotations") or {}
    want_notes = want["metadata"].get("annotations") or {}
    notes = {
        key: want_notes.get(key)  # None removes it
        for key in (SERVING_CPUS_ANNOTATION, PROFILE_ONLY_ANNOTATION)
        if have_notes.get(key) != want_notes.get(key)
    }
    if notes:
        patch["metadata"] = {"annotations": notes}
    labels = labels_drift(current, want)
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels["metadata"]["labels"]
    return patch


def ensure_router(
    p: Pass, pipe: PipelineObject, children: PipelineChildren, *, image: str
) -> dict[str, Any] | None:
    """The router's ConfigMap, Deployment and the pipeline's Service; the Deployment as
    observed (None when it was created by this pass)."""
    ns = p.namespace
    cm = pm.router_configmap(pipe)
    keep(p.kube, "configmaps", ns, cm, current=children.configmap, ours=p.owns, drift=_cm_drift)
    # the routers' /arrivals needs the pipeline's token; no router mounts a Secret not ours
    # (a conflict, recorded: the caller reports it)
    holder = Holder(pm.PIPELINE_KIND, router_token_name(pipe.name), pm.token_labels(pipe.name))
    if ensure_token(p, holder) is None:
        return None
    dep = pm.router_deployment(pipe, replicas=ROUTER_REPLICAS, image=image)
    router = keep(
        p.kube, "deployments", ns, dep, current=children.deployment, ours=p.owns, drift=_dep_drift
    )
    svc = pm.pipeline_service(pipe)
    keep(p.kube, "services", ns, svc, current=children.service, ours=p.owns, drift=service_drift)
    # created or given a new template: not ready until its pods are
    return router.obj if router.outcome is Outcome.KEPT else None


def _cm_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    if current.get("data") == want["data"] and not labels_drift(current, want):
        return {}
    return {"data": want["data"], "metadata": {"labels": dict(want["metadata"]["labels"])}}


def _dep_drift(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    if covers(current.get("spec") or {}, want["spec"]) and not labels_drift(current, want):
        return {}
    return {"spec": want["spec"], "metadata": {"labels": dict(want["metadata"]["labels"])}}
