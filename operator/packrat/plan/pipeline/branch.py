"""Branches decided by a stage's output: when a query takes an edge.

An edge without a condition is taken at random with its ``fraction`` (InferLine's scale
factor, what the planner simulates). An edge with ``when`` is taken when the source stage's
answer says so, which is what a cascade needs ("call the big model only when the small one
is unsure"); its ``fraction`` is then the planner's expectation of how often, and the
router counts how often it really is (:func:`measured_fractions`), so the plan can be made
again on what the traffic does.

A condition reads one thing from the answer:

- ``{header: X-Unsure, equals: "true"}``: a response header (name case-insensitive), as a
  string;
- ``{json: result.confidence, below: 0.8}``: a field of a JSON answer by dotted path (list
  indices as numbers), compared with ``equals`` (a string, number or boolean), ``below`` or
  ``above`` (numbers; booleans are not numbers here).

Answers are input: a body that is not JSON, over ``MAX_JSON_BYTES``, or without the field,
and a header that is missing, decide "not taken"; nothing raises. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from packrat.plan.pipeline.simulate import PipelineError

MAX_JSON_BYTES = 1024 * 1024
MAX_PATH_PARTS = 16
CONDITION_KEYS = {"header", "json", "equals", "below", "above"}
Scalar = str | float | int | bool


@dataclass(frozen=True, slots=True)
class Condition:
    """Take the edge when the answer's ``header`` or ``json`` field compares as given."""

    header: str | None = None
    json: tuple[str, ...] | None = None
    equals: Scalar | None = None
    below: float | None = None
    above: float | None = None

    def to_doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.header is not None:
            out["header"] = self.header
        if self.json is not None:
            out["json"] = ".".join(self.json)
        for key in ("equals", "below", "above"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def known_mapping(doc: Any, known: Set[str], *, where: str, holding: str) -> Mapping[str, Any]:
    """``doc`` as a mapping of ``known`` fields only, else the error naming ``where`` and what
    it should hold (``holding``): a condition's check, and the router config's."""
    if not isinstance(doc, Mapping):
        raise PipelineError(f"{where}: expected a mapping with {holding}")
    extra = sorted(set(doc) - known)
    if extra:
        raise PipelineError(f"{where}: unknown field(s) {', '.join(extra)}")
    return doc


def parse_condition(doc: Any, *, where: str = "when") -> Condition:
    """A condition from its document (a spec's or the router config's ``when``)."""
    doc = known_mapping(doc, CONDITION_KEYS, where=where, holding="header or json and a comparison")
    header, path = doc.get("header"), doc.get("json")
    if (header is None) == (path is None):
        raise PipelineError(f"{where}: exactly one of header and json")
    if header is not None and (not isinstance(header, str) or not header or len(header) > 128):
        raise PipelineError(f"{where}.header: expected a header name")
    parts: tuple[str, ...] | None = None
    if path is not None:
        if not isinstance(path, str) or not path or len(path) > 256:
            raise PipelineError(f"{where}.json: expected a dotted field path")
        parts = tuple(path.split("."))
        if len(parts) > MAX_PATH_PARTS or not all(parts):
            raise PipelineError(f"{where}.json: {path!r} is not a dotted field path")
    tests = [k for k in ("equals", "below", "above") if k in doc]
    if len(tests) != 1:
        raise PipelineError(f"{where}: exactly one of equals, below and above")
    value = doc[tests[0]]
    if tests[0] == "equals":
        if not isinstance(value, str | bool) and not _is_number(value):
            raise PipelineError(f"{where}.equals: expected a string, number or boolean")
        if header is not None and not isinstance(value, str):
            raise PipelineError(f"{where}.equals: a header compares as a string")
        return Condition(header=header, json=parts, equals=value)
    if header is not None:
        raise PipelineError(f"{where}.{tests[0]}: a header compares with equals only")
    if not _is_number(value):
        raise PipelineError(f"{where}.{tests[0]}: expected a number")
    if tests[0] == "below":
        return Condition(json=parts, below=float(value))
    return Condition(json=parts, above=float(value))


def _field(doc: Any, path: Sequence[str]) -> Any:
    for part in path:
        if isinstance(doc, Mapping):
            if part not in doc:
                return None
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return None
    return doc


def taken(
    cond: Condition, *, headers: Mapping[str, str], body: bytes, content_type: str = ""
) -> bool:
    """Whether an answer (its headers, lower-cased names, and body) takes the edge."""
    if cond.header is not None:
        value = headers.get(cond.header.lower())
        return value is not None and value.strip() == cond.equals
    assert cond.json is not None
    if len(body) > MAX_JSON_BYTES or ("json" not in content_type and content_type):
        return False
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    value = _field(doc, cond.json)
    if value is None:
        return False
    if cond.equals is not None:
        if isinstance(cond.equals, bool) or isinstance(value, bool):
            return value is cond.equals
        if isinstance(cond.equals, str):
            return isinstance(value, str) and value == cond.equals
        return _is_number(value) and float(value) == float(cond.equals)
    if not _is_number(value):
        return False
    if cond.below is not None:
        return float(value) < cond.below
    assert cond.above is not None
    return float(value) > cond.above


def measured_fractions(
    taken_counts: Mapping[tuple[str, str], float], answered: Mapping[str, float]
) -> dict[tuple[str, str], float]:
    """Each edge's share of its source's answers that took it (edges whose source answered
    nothing are left out: no evidence), from counters over the same window."""
    out = {}
    for (src, dst), n in taken_counts.items():
        total = answered.get(src, 0.0)
        if total > 0 and math.isfinite(n) and n >= 0:
            out[(src, dst)] = min(1.0, n / total)
    return out
