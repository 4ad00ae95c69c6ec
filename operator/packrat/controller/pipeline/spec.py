"""A PackratPipeline read once per pass: validated, defaulted and typed.

The CRD (``crds/packratpipeline.yaml``) enforces types, bounds and the CEL rules, but, as for
PackratModel, the operator does not trust that a stored object passed them: ``parse_pipeline``
checks the same rules (and each stage's model spec against the PackratModel rules, with the
fields the planner sets filled in) and raises ``InvalidSpec`` with every problem found. Every
later step reads the typed ``PipelineObject``, never the raw object.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.api.schema import PIPELINE_CRD, schema_check, schema_defaults
from packrat.controller.core.model import InvalidSpec, ModelSpec, read
from packrat.controller.core.slo_spec import AUTOSCALING_DEFAULTS, SLO_DEFAULTS, validate_slo
from packrat.controller.core.spec import API_VERSION, DEFAULT_IMAGE
from packrat.controller.pipeline.manifests import stage_model_name
from packrat.plan.pipeline.branch import parse_condition
from packrat.plan.pipeline.simulate import (
    DEFAULT_HOP_OVERHEAD_MS,
    Edge,
    Pipeline,
    PipelineError,
    Stage,
)

MAX_PIPELINE_NAME = 19
MAX_STAGE_NAME = 20
MAX_STAGES = 16
MAX_EDGES = 64
# a stage's model spec must leave these to the pipeline planner (and its tuner)
PLANNED_FIELDS = ("batchSize", "autoBatch", "slo", "replicas", "autoscaling")
HOP_FIELD = "hopOverheadMs"
_STAGE_NAME_RE = re.compile(r"^[a-z0-9]$|^[a-z0-9][-a-z0-9]*[a-z0-9]$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage: its name, its PackratModel's name and the user's model spec, typed as its
    stage model will carry it (batch 1 until the planner chooses one)."""

    name: str
    model_name: str
    model: ModelSpec

    @property
    def cpus(self) -> int:
        return self.model.cpus

    @property
    def max_batch_delay_ms(self) -> float:
        return float(self.model.max_batch_delay_ms)


@dataclass(frozen=True, slots=True)
class PipelineObject:
    """One PackratPipeline as a pass sees it."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    stages: tuple[StageSpec, ...]
    edges: tuple[Edge, ...]
    slo: Mapping[str, Any]  # defaults filled in (cv, durationSeconds); no hopOverheadMs
    deadline_ms: float | None
    hop_overhead_ms: float = DEFAULT_HOP_OVERHEAD_MS  # per HTTP hop along a path
    autoscaling: Mapping[str, Any] | None = None  # spec.autoscaling, defaults filled in

    @property
    def slo_ms(self) -> float:
        return float(self.slo["latencyP99Ms"])

    @property
    def autoscaling_mode(self) -> str | None:
        return str(self.autoscaling["mode"]) if self.autoscaling is not None else None

    @property
    def max_cores(self) -> int | None:
        value = self.slo.get("maxCores")
        return int(value) if value is not None else None

    def stage(self, name: str) -> StageSpec:
        return next(s for s in self.stages if s.name == name)

    def owner(self) -> dict[str, Any]:
        """The owner object the manifest builders reference (name, namespace, uid)."""
        return {
            "apiVersion": API_VERSION,
            "kind": "PackratPipeline",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid or ""},
        }


def _stage(
    errors: list[str], i: int, doc: Any, pipeline: str, *, namespace: str, default_image: str
) -> StageSpec | None:
    """spec.stages[i] typed, its model read as its stage model will carry it; None when the
    CRD's checks (reported by :func:`_parse`) or the model's own refuse it."""
    where = f"spec.stages[{i}]"
    name = doc.get("name") if isinstance(doc, Mapping) else None
    model = doc.get("model") if isinstance(doc, Mapping) else None
    if (
        not isinstance(name, str)
        or len(name) > MAX_STAGE_NAME
        or not _STAGE_NAME_RE.fullmatch(name)
        or name == "router"
        or not isinstance(model, Mapping)
        or any(k in model for k in PLANNED_FIELDS)
    ):
        return None  # the schema's and CEL rules' messages say why
    child = stage_model_name(pipeline, name)
    probe = {**copy.deepcopy(dict(model)), "batchSize": 1}  # what the stage model will carry
    meta = {"name": child, "namespace": namespace}
    typed, problems = read(probe, default_image=default_image, meta=meta, name=child)
    errors.extend(f"{where}.model: {e}" for e in problems)
    if typed is None:
        return None
    return StageSpec(name=name, model_name=child, model=typed)


def _edge(errors: list[str], i: int, doc: Any, names: set[str]) -> Edge | None:
    """spec.edges[i] typed; None when the CRD's checks (reported by :func:`_parse`) or the
    stage names refuse it."""
    where = f"spec.edges[{i}]"
    src = doc.get("from") if isinstance(doc, Mapping) else None
    dst = doc.get("to") if isinstance(doc, Mapping) else None
    if not isinstance(src, str) or not isinstance(dst, str):
        return None
    bad = [end for end in (src, dst) if end not in names]
    if bad:
        errors.append(f"{where}: unknown stage {bad[0]!r}")
        return None
    fraction = doc.get("fraction", 1.0)
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not 0.0 <= fraction <= 1.0
    ):
        return None
    when = None
    if "when" in doc:
        try:
            when = parse_condition(doc["when"], where=f"{where}.when")
        except PipelineError as exc:
            errors.append(str(exc))
            return None
    return Edge(src, dst, float(fraction), when)


def parse_pipeline(obj: Mapping[str, Any], *, default_image: str = DEFAULT_IMAGE) -> PipelineObject:
    """Validate and type ``obj``; ``InvalidSpec`` for any problem, never another error.
    ``default_image``: what a stage model without ``image`` runs (the operator's)."""
    try:
        return _parse(obj, default_image=default_image)
    except InvalidSpec:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise InvalidSpec([f"spec could not be read: {type(exc).__name__}: {exc}"[:500]]) from None


def _parse(obj: Mapping[str, Any], *, default_image: str) -> PipelineObject:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = str(meta.get("namespace") or "default")
    errors: list[str] = []
    if len(name) > MAX_PIPELINE_NAME or not _NAME_RE.fullmatch(name):
        errors.append(
            f"metadata.name must be a DNS label of at most {MAX_PIPELINE_NAME} characters "
            f"starting with a letter (stage models are <pipeline>-<stage>), got {name!r}"
        )
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidSpec([*errors, "spec must be an object"])
    more: list[str] = []  # what only Python checks
    stages, all_stages = _stages(more, spec, name, namespace=namespace, default_image=default_image)
    edges, all_edges = _edges(more, spec, {s.name for s in stages})
    slo, hop, auto, checked = _slo(more, spec)
    errors += schema_check(PIPELINE_CRD, "spec").errors(checked, "spec", extra=more)
    deadline = spec.get("deadlineMs")
    if not errors and all_stages and all_edges:
        try:  # the DAG's own rules (no cycle, no edge declared twice), on placeholder tables
            Pipeline([Stage(s.name, {(1, 1): 1.0}) for s in stages], edges)
        except PipelineError as exc:
            errors.append(f"spec.edges: {exc}")
    if errors:
        raise InvalidSpec(errors)
    generation = meta.get("generation")
    return PipelineObject(
        name=name,
        namespace=namespace,
        uid=meta.get("uid"),
        generation=generation if isinstance(generation, int) else None,
        stages=tuple(stages),
        edges=tuple(edges),
        slo=slo,
        deadline_ms=float(deadline) if deadline is not None else None,
        hop_overhead_ms=float(hop),
        autoscaling=auto,
    )


def _stages(
    errors: list[str],
    spec: Mapping[str, Any],
    name: str,
    *,
    namespace: str,
    default_image: str,
) -> tuple[list[StageSpec], bool]:
    """spec.stages, and whether every one of them was read (no name used twice)."""
    stages_doc = spec.get("stages")
    stages: list[StageSpec] = []
    if not isinstance(stages_doc, list) or not 1 <= len(stages_doc) <= MAX_STAGES:
        stages_doc = []  # the schema check reports it
    for i, doc in enumerate(stages_doc):
        stage = _stage(errors, i, doc, name, namespace=namespace, default_image=default_image)
        if stage is not None:
            stages.append(stage)
    names = [s.name for s in stages]
    for dupe in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"spec.stages: the name {dupe!r} is used twice")
    return stages, len(stages) == len(stages_doc)


def _edges(errors: list[str], spec: Mapping[str, Any], names: set[str]) -> tuple[list[Edge], bool]:
    """spec.edges between the stages ``names``, and whether every one of them was read."""
    edges_doc = spec.get("edges", [])
    edges: list[Edge] = []
    if not isinstance(edges_doc, list) or len(edges_doc) > MAX_EDGES:
        edges_doc = []  # the schema check reports it
    for i, doc in enumerate(edges_doc):
        edge = _edge(errors, i, doc, names)
        if edge is not None:
            edges.append(edge)
    return edges, len(edges) == len(edges_doc)


def _slo(
    errors: list[str], spec: Mapping[str, Any]
) -> tuple[dict[str, Any], Any, Any, dict[str, Any]]:
    """spec.slo with its defaults (less the hop overhead), the hop overhead (ms),
    spec.autoscaling with its defaults (None when absent), and the spec as the CRD's schema
    checks it (slo and autoscaling with the CRD's defaults)."""
    checked = dict(spec)
    slo = spec.get("slo")
    if not isinstance(slo, Mapping):
        return {}, DEFAULT_HOP_OVERHEAD_MS, None, checked
    slo = {**SLO_DEFAULTS, **slo}
    checked["slo"] = dict(slo)
    hop = slo.pop(HOP_FIELD, DEFAULT_HOP_OVERHEAD_MS)
    auto = spec.get("autoscaling")
    if isinstance(auto, Mapping):
        given = {k: v for k, v in auto.items() if k != "reference"}
        if "reference" in auto:  # the schema has no reference: say why
            errors.append("spec.autoscaling.reference: unknown field (the planner makes it)")
        checked["autoscaling"] = {**schema_defaults(PIPELINE_CRD, "spec", "autoscaling"), **given}
        auto = {**AUTOSCALING_DEFAULTS, **given}
    validate_slo(errors, {"slo": slo, **({"autoscaling": auto} if isinstance(auto, dict) else {})})
    if not isinstance(hop, int | float) or isinstance(hop, bool):
        hop = DEFAULT_HOP_OVERHEAD_MS  # the schema check reports it
    return slo, hop, auto, checked
