"""Pipeline files: the stages, edges and SLO that ``packrat provision --pipeline`` plans.

The file is YAML (or JSON, which YAML reads too) in the shape of a PackratPipeline's spec,
with a profile file per stage instead of a model to profile::

    stages:
      - name: detect
        profile: profiles/tiny.csv      # relative to this file
        maxCpus: 8                      # optional: the largest replica (default: T)
      - name: classify
        profile: profiles/resnet50.json
    edges:
      - {from: detect, to: classify, fraction: 0.3}   # fraction optional, default 1
      # a branch the first stage's answer decides; fraction: how often it is expected to
      # - {from: detect, to: classify, fraction: 0.3, when: {json: confidence, below: 0.8}}
    slo:
      latencyP99Ms: 500                 # optional when --slo-p99-ms is given

Every error is one line naming the file and the field (``stages[1].profile: ...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packrat.plan.pipeline.branch import parse_condition
from packrat.plan.pipeline.simulate import Edge, Pipeline, PipelineError, Stage
from packrat.plan.profile import ProfileError, load_profile

MAX_STAGES = 16  # as the PackratPipeline CRD: planning cost grows fast with stages
MAX_SPEC_BYTES = 1024 * 1024
STAGE_KEYS = {"name", "profile", "maxCpus"}
EDGE_KEYS = {"from", "to", "fraction", "when"}
TOP_KEYS = {"stages", "edges", "slo"}


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    pipeline: Pipeline
    slo_ms: float | None
    models: dict[str, str | None]  # stage -> model name from its profile's metadata


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(where: str, doc: Any, known: set[str], *, holding: str) -> Mapping[str, Any]:
    """``doc`` as a mapping of ``known`` fields only (``holding``: what it should hold, for
    the error); every mapping of a pipeline file is checked this one way."""
    if not isinstance(doc, Mapping):
        raise PipelineError(f"{where}: expected a mapping with {holding}")
    extra = sorted(set(doc) - known)
    if extra:
        raise PipelineError(
            f"{where}: unknown field(s) {', '.join(extra)} (known: {', '.join(sorted(known))})"
        )
    return doc


def _text(where: str, doc: Mapping[str, Any], key: str, *, expected: str) -> str:
    """``doc[key]`` as a non-empty string (``expected``: what it should be, for the error)."""
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise PipelineError(f"{where}.{key}: expected {expected}")
    return value


def parse_pipeline_spec(doc: Any, *, base: Path, origin: str = "<pipeline>") -> PipelineSpec:
    """Validate a parsed pipeline document; profile paths are relative to ``base``."""
    doc = _mapping(origin, doc, TOP_KEYS, holding="'stages' and 'edges'")
    stages_doc = doc.get("stages")
    if not isinstance(stages_doc, list) or not stages_doc:
        raise PipelineError(f"{origin}: stages: expected a non-empty list of stages")
    if len(stages_doc) > MAX_STAGES:
        raise PipelineError(f"{origin}: stages: at most {MAX_STAGES} stages, got {len(stages_doc)}")
    stages: list[Stage] = []
    models: dict[str, str | None] = {}
    for i, stage_doc in enumerate(stages_doc):
        where = f"{origin}: stages[{i}]"
        s = _mapping(where, stage_doc, STAGE_KEYS, holding="name and profile")
        name = _text(where, s, "name", expected="a non-empty string")
        prof = _text(where, s, "profile", expected="a path to a profile file")
        try:
            profile = load_profile(base / prof)
        except ProfileError as exc:
            raise PipelineError(f"{where}.profile: {exc}") from None
        top = profile.meta.cpus or profile.max_threads
        max_cpus = s.get("maxCpus")
        if max_cpus is not None:
            if isinstance(max_cpus, bool) or not isinstance(max_cpus, int) or max_cpus < 1:
                raise PipelineError(f"{where}.maxCpus: expected an integer >= 1")
            if max_cpus > top:
                raise PipelineError(
                    f"{where}.maxCpus: {max_cpus} exceeds the {top} cores the profile was "
                    "measured on"
                )
        stages.append(Stage(name, profile.table(), min(max_cpus or top, top)))
        models[name] = profile.meta.model
    edges_doc = doc.get("edges", [])
    if not isinstance(edges_doc, list):
        raise PipelineError(f"{origin}: edges: expected a list")
    edges: list[Edge] = []
    for i, edge_doc in enumerate(edges_doc):
        where = f"{origin}: edges[{i}]"
        e = _mapping(where, edge_doc, EDGE_KEYS, holding="from, to and fraction")
        src, dst = e.get("from"), e.get("to")
        if not isinstance(src, str) or not isinstance(dst, str):
            raise PipelineError(f"{where}: 'from' and 'to' must be stage names")
        fraction = e.get("fraction", 1.0)
        if not _number(fraction):
            raise PipelineError(f"{where}.fraction: expected a number in [0, 1]")
        when = parse_condition(e["when"], where=f"{where}.when") if "when" in e else None
        edges.append(Edge(src, dst, float(fraction), when))
    slo_ms: float | None = None
    slo = doc.get("slo")
    if slo is not None:
        slo = _mapping(f"{origin}: slo", slo, {"latencyP99Ms"}, holding="latencyP99Ms")
        value: Any = slo.get("latencyP99Ms")
        if not (_number(value) and value > 0):
            raise PipelineError(f"{origin}: slo.latencyP99Ms: expected a number of ms > 0")
        slo_ms = float(value)
    try:
        pipeline = Pipeline(stages, edges)
    except PipelineError as exc:
        raise PipelineError(f"{origin}: {exc}") from None
    return PipelineSpec(pipeline=pipeline, slo_ms=slo_ms, models=models)


def load_pipeline_spec(path: str | Path) -> PipelineSpec:
    """Read and validate a pipeline file (YAML or JSON)."""
    import yaml

    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise PipelineError(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PipelineError(f"{path}: not a text file") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise PipelineError(f"{path}: not valid YAML{at}") from None
    except RecursionError:
        raise PipelineError(f"{path}: nested too deeply") from None
    return parse_pipeline_spec(doc, base=path.parent, origin=str(path))
