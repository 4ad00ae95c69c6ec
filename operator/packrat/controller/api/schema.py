"""Check a custom resource's spec against its CRD's own schema and CEL rules.

The CRDs (``crds/*.yaml``; the package carries byte-identical copies, ``make crds-sync``) are
the one source of the spec's types, bounds, enums, patterns, lengths, required fields and
cross-field (CEL) rules. A real API server enforces them, but objects also reach the operator
without one (a CRD updated later, an emulator, ``packrat`` reading a YAML file), so the
operator checks them again here, from the same schema, with one message per violation: the
field's path and the rule it breaks. Checks the schema cannot state (URL parsers, DNS names of
other objects, sums over fields) stay in Python beside the spec they check.

Why jsonschema (a dependency of the operator extra): a Kubernetes structural schema is
OpenAPI 3.0's subset of JSON Schema draft 4 (boolean ``exclusiveMinimum``, ``integer`` that
excludes 1.0), which jsonschema's maintained ``Draft4Validator`` checks keyword for keyword,
reporting each violation with its path. The Kubernetes extensions have no JSON Schema meaning,
so :func:`to_json_schema` maps each one explicitly; CEL rules are read by
:mod:`packrat.controller.api.cel`.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from importlib import resources
from typing import Any

import yaml
from jsonschema import Draft4Validator
from jsonschema.exceptions import ValidationError

from packrat.controller.api.cel import rule_errors

MODEL_CRD = "packratmodel.yaml"
PIPELINE_CRD = "packratpipeline.yaml"

# Kubernetes keywords with no JSON Schema meaning (each mapped or dropped by to_json_schema)
_KUBERNETES_ONLY = {
    "x-kubernetes-validations",  # CEL: packrat.controller.api.cel
    "x-kubernetes-int-or-string",  # -> anyOf integer, string
    "x-kubernetes-preserve-unknown-fields",  # -> unknown fields allowed
    "x-kubernetes-list-type",  # set -> uniqueItems; atomic, map: no check here
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource",
    "nullable",  # -> null among the types
    "default",  # filled in by the spec's defaulter (schema_defaults), not checked
    "description",
    "format",  # byte, int32...: the API server's format checks are not repeated
}


@functools.cache
def crd_schema(filename: str) -> Mapping[str, Any]:
    """The openAPIV3Schema of the storage version of the package's copy of ``filename``."""
    text = resources.files("packrat.controller.api").joinpath("crds", filename).read_text()
    crd = yaml.safe_load(text)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def to_json_schema(node: Mapping[str, Any]) -> dict[str, Any]:
    """A structural schema ``node`` as JSON Schema draft 4. An object with properties takes
    no others (the API server prunes them; the operator reports them as unknown) unless it
    preserves unknown fields."""
    out = {k: v for k, v in node.items() if k not in _KUBERNETES_ONLY}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if isinstance(node.get("pattern"), str):
        out["pattern"] = _go_anchors(node["pattern"])
    if node.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
        if "additionalProperties" not in node and not node.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), Mapping):
            out[key] = to_json_schema(node[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            out[key] = [to_json_schema(n) for n in node[key]]
    return out


def _go_anchors(pattern: str) -> str:
    """``pattern`` as the API server's Go (RE2) regexp reads it: ``$`` (outside a character
    class) matches at the end of the text only, where Python's also matches before a final
    newline."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            out.append("\\Z")
            continue
        out.append(char)
    return "".join(out)


class SchemaCheck:
    """The checks of one schema node (a CRD's ``spec``, or a part of it such as
    ``spec.model``): :meth:`errors` lists every violation of a value."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._validator = Draft4Validator(to_json_schema(schema))

    def errors(self, value: Any, where: str, *, extra: Iterable[str] = ()) -> list[str]:
        """One message per violation, each naming the field (``where`` is ``value``'s own
        path, e.g. ``spec``): the schema's, then ``extra`` (the checks only Python can make,
        each message starting with its field's path), then the CEL rules'. A field both
        report keeps one message: Python's where the schema's is a bare pattern (Python's
        says what the pattern means), the schema's otherwise."""
        value = _pruned(value)
        schema = [
            (message, error.validator)
            for error in self._validator.iter_errors(value)
            for message in _messages(error, where)
        ]
        extra = list(extra)
        explained = {_field(m) for m in extra}
        kept = [m for m, kind in schema if kind != "pattern" or _field(m) not in explained]
        messages = list(dict.fromkeys([*_non_finite(value, where), *sorted(kept)]))
        reported = {_field(m) for m in messages}
        messages += [m for m in extra if _field(m) not in reported]
        return messages + rule_errors(self.schema, value, where)


def _pruned(value: Any) -> Any:
    """``value`` without null fields, as the API server prunes them (no schema here marks a
    field nullable) before it validates."""
    if isinstance(value, Mapping):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _non_finite(value: Any, where: str) -> Iterator[str]:
    """A message for every NaN or infinity in ``value`` (JSON has none, YAML does; a
    schema's bounds do not catch NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{where} must be a finite number, got {value!r}"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, f"{where}[{i}]")


def _node(filename: str, path: tuple[str, ...]) -> Mapping[str, Any]:
    """The schema node at ``path`` (property names) under the CRD's root."""
    node = crd_schema(filename)
    for name in path:
        node = node["properties"][name]
    return node


@functools.cache
def schema_check(filename: str, *path: str) -> SchemaCheck:
    """The check of the node at ``path`` (property names) under the CRD's root, built once."""
    return SchemaCheck(_node(filename, path))


def schema_defaults(filename: str, *path: str) -> dict[str, Any]:
    """The ``default:`` the CRD states for each property of the object at ``path``, in the
    schema's order: what the API server fills into such an object given without them (the
    one source of these defaults; a fresh copy, the caller's to change)."""
    properties = _node(filename, path).get("properties") or {}
    return {k: copy.deepcopy(v["default"]) for k, v in properties.items() if "default" in v}


def _field(message: str) -> str:
    """The field a message is about: its first word, less a trailing colon."""
    return message.split(" ", 1)[0].removesuffix(":")


def _path(where: str, steps: Any) -> str:
    for step in steps:
        where += f"[{step}]" if isinstance(step, int) else f".{step}"
    return where


def _messages(error: ValidationError, where: str) -> Iterator[str]:
    """The messages of one jsonschema error: the field, then what it must be."""
    at, kind, value = _path(where, error.absolute_path), error.validator, error.instance
    node: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
    if kind == "required" and isinstance(value, Mapping):
        for name in error.validator_value:
            if name not in value:
                yield f"{at}.{name} is required"
    elif kind == "additionalProperties" and isinstance(value, Mapping):
        known = set(node.get("properties") or {})
        for name in sorted(set(value) - known):
            yield f"{at}.{name}: unknown field"
    elif kind == "pattern":
        pattern = str(node["pattern"])
        shown = pattern.replace("\\Z", "$")
        yield f"{at} must match {shown}, got {_clip(value)}"
    elif kind in ("minLength", "maxLength"):
        yield f"{at} must be {_strings(node)}, got {_clip(value)}"
    elif kind in ("type", "enum", "minimum", "maximum"):
        yield f"{at} must be {expected(node)}, got {_clip(value)}"
    elif kind in ("minItems", "maxItems"):
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        count = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        yield f"{at} must have {count} items, got {len(value)}"
    elif kind == "uniqueItems":
        yield f"{at} must not repeat a value"
    elif kind == "maxProperties":
        yield f"{at} must have at most {node['maxProperties']} fields"
    else:
        yield f"{at}: {error.message}"


def _clip(value: Any) -> str:
    """``value`` as a message shows it (a long one cut)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def expected(node: Mapping[str, Any]) -> str:
    """What a schema node accepts, in words (``an integer in 1..256``)."""
    if "enum" in node:
        return "one of " + ", ".join(str(v) if v != "" else "''" for v in node["enum"])
    kind = node.get("type")
    if kind in ("integer", "number"):
        return _numbers(node)
    if kind == "string":
        return _strings(node)
    return {"object": "an object", "array": "a list", "boolean": "a boolean"}.get(
        str(kind), f"of type {kind}"
    )


def _numbers(node: Mapping[str, Any]) -> str:
    noun = "an integer" if node.get("type") == "integer" else "a number"
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is None and hi is None:
        return noun
    if node.get("type") == "integer" and lo is not None and hi is not None:
        return f"{noun} in {lo}..{hi}"
    left = "(" if node.get("exclusiveMinimum") else "["
    right = ")" if node.get("exclusiveMaximum") else "]"
    if hi is None:
        return f"{noun} {'>' if left == '(' else '>='} {lo}"
    if lo is None:
        return f"{noun} {'<' if right == ')' else '<='} {hi}"
    return f"{noun} in {left}{lo:g}, {hi:g}{right}"


def _strings(node: Mapping[str, Any]) -> str:
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    text = "a non-empty string" if lo == 1 else "a string"
    if hi is not None:
        text += f" of at most {hi} characters"
    return text
