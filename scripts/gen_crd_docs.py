"""Generate docs/crd-reference.md from the CRD schemas' descriptions.

The CRD's openAPIV3Schema is the single source of truth for the API (it is also what
`kubectl explain` shows), so the configuration reference is generated from it rather than
written by hand. `make docs` writes the file; `--check` fails when it is out of date (a unit
test does the same, so the reference cannot drift from the CRD).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = ROOT / "crds"
GROUP = "packrat.dev"  # the API documented here; kopf's peering CRDs live in crds/ too
OUTPUT = ROOT / "docs" / "crd-reference.md"

_CONSTRAINTS = (
    ("enum", "one of"),
    ("minimum", "min"),
    ("maximum", "max"),
    ("minLength", "min length"),
    ("maxLength", "max length"),
    ("minItems", "min items"),
    ("maxItems", "max items"),
    ("pattern", "pattern"),
    ("format", "format"),
)


def _cell(text: str) -> str:
    """Make ``text`` safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("`", "'") + "`"


def type_of(schema: Mapping[str, Any]) -> str:
    """Short type name of a schema node, e.g. ``[]integer`` or ``map[string]string``."""
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return "[]" + type_of(schema.get("items", {}))
    if kind == "object" and "additionalProperties" in schema and "properties" not in schema:
        extra = schema["additionalProperties"]
        return "map[string]" + (type_of(extra) if isinstance(extra, Mapping) else "any")
    return kind


def constraints(schema: Mapping[str, Any], *, required: bool) -> str:
    parts = ["**required**"] if required else []
    for key, label in _CONSTRAINTS:
        if key not in schema:
            continue
        value = schema[key]
        if key == "enum":
            parts.append(label + " " + ", ".join(_code(v) for v in value))
        elif key == "minimum" and schema.get("exclusiveMinimum") is True:
            parts.append(f"> {value}")
        else:
            parts.append(f"{label} {_code(value) if key == 'pattern' else value}")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        parts.append("free-form")
    return "; ".join(parts)


def walk(schema: Mapping[str, Any], *, path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    """Every field below ``schema`` as (dotted path, schema, required), depth first."""
    required = set(schema.get("required", ()))
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child, name in required
        target = child.get("items", {}) if child.get("type") == "array" else child
        suffix = "[]" if child.get("type") == "array" else ""
        yield from walk(target, path=child_path + suffix)


def rules(schema: Mapping[str, Any], *, path: str) -> Iterator[tuple[str, str, str]]:
    """Every CEL validation rule below ``schema`` as (path, rule, message)."""
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path or "(object)", str(rule["rule"]), str(rule.get("message", ""))
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        target = child.get("items", {}) if child.get("type") == "array" else child
        yield from rules(target, path=child_path)


def field_table(schema: Mapping[str, Any], *, root: str) -> list[str]:
    lines = [
        "| Field | Type | Default | Constraints | Description |",
        "|---|---|---|---|---|",
    ]
    for path, child, required in walk(schema, path=root):
        default = _code(child["default"]) if "default" in child else ""
        lines.append(
            f"| `{path}` | {_cell(type_of(child))} | {_cell(default)} "
            f"| {_cell(constraints(child, required=required))} "
            f"| {_cell(str(child.get('description', '')))} |"
        )
    return lines


def render_crd(crd: Mapping[str, Any], *, source: str) -> list[str]:
    spec = crd["spec"]
    names = spec["names"]
    lines: list[str] = []
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        api = f"{spec['group']}/{version['name']}"
        lines += [
            f"## {names['kind']} ({api})",
            "",
            _cell(str(schema.get("description", ""))),
            "",
            f"- Source: `{source}`",
            f"- Scope: {spec['scope']}; plural `{names['plural']}`"
            + (f"; short names {', '.join(_code(s) for s in names.get('shortNames', []))}")
            + (f"; categories {', '.join(_code(c) for c in names.get('categories', []))}"),
            f"- Served: {str(version.get('served', False)).lower()}; "
            f"storage: {str(version.get('storage', False)).lower()}"
            + ("; status subresource" if "status" in version.get("subresources", {}) else ""),
            "",
        ]
        columns = version.get("additionalPrinterColumns", [])
        if columns:
            lines += [
                "### `kubectl get` columns",
                "",
                "| Column | JSONPath | Description |",
                "|---|---|---|",
            ]
            lines += [
                f"| {c['name']} | `{c['jsonPath']}` | {_cell(str(c.get('description', '')))} |"
                for c in columns
            ]
            lines.append("")
        for part in ("spec", "status"):
            sub = schema.get("properties", {}).get(part)
            if sub is None:
                continue
            lines += [f"### {part}", "", _cell(str(sub.get("description", ""))), ""]
            lines += field_table(sub, root=part)
            lines.append("")
        cel = list(rules(schema, path=""))
        if cel:
            lines += [
                "### Validation rules (CEL, checked by the API server)",
                "",
                "| Applies to | Rule | Message |",
                "|---|---|---|",
            ]
            lines += [f"| `{p}` | {_cell(_code(r))} | {_cell(m)} |" for p, r, m in cel]
            lines.append("")
    return lines


def generate(*, crd_dir: Path = CRD_DIR) -> str:
    """The whole reference document for every CRD in ``crd_dir``."""
    lines = [
        "# Packrat API reference (PackratModel, PackratPipeline)",
        "",
        "<!-- Generated by scripts/gen_crd_docs.py from crds/*.yaml; do not edit by hand. -->",
        "<!-- Regenerate with `make docs`; tests/unit/deploy/test_docs.py checks it. -->",
        "",
        "Every field below is also documented in the cluster: `kubectl explain packratmodel.spec`,"
        " `kubectl explain packratpipeline.spec`.",
        "",
    ]
    paths = sorted(p for p in crd_dir.glob("*.y*ml") if p.is_file())
    if not paths:
        raise SystemExit(f"gen_crd_docs: no CRD manifests in {crd_dir}")
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if (
                isinstance(doc, dict)
                and doc.get("kind") == "CustomResourceDefinition"
                and doc.get("spec", {}).get("group") == GROUP  # not kopf's peering CRDs
            ):
                rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                lines += render_crd(doc, source=str(rel))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"gen_crd_docs: {args.output} is out of date; run `make docs`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"gen_crd_docs: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
