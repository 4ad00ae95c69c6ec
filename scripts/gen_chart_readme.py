"""Generate the values table of helm/packrat-operator/README.md from values.yaml's comments.

A key documented with a comment block that starts with ``# --`` (helm-docs' convention) gets a
row: its dotted path, type, default and the comment. The table sits between the README's
``<!-- values:start -->`` and ``<!-- values:end -->`` markers.

    python scripts/gen_chart_readme.py           # rewrite the table
    python scripts/gen_chart_readme.py --check   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "packrat-operator"
START, END = "<!-- values:start -->", "<!-- values:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def documented(values_text: str) -> list[tuple[str, str]]:
    """(dotted key, description) for every key with a ``# --`` comment, in file order."""
    rows: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if match is None:
            comment = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        starts = [i for i, c in enumerate(comment) if c.startswith("--")]
        if starts:
            text = " ".join(comment[starts[-1] :])[2:].strip()
            rows.append((".".join(k for _, k in stack), text))
        comment = []
    return rows


def _lookup(values: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


def _type(value: Any) -> str:
    if value is None:  # an optional list (modelPolicy): null means "not restricted"
        return "list or null"
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}[
        type(value)
    ]


def table(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for key, text in documented(values_text):
        value = _lookup(values, key)
        default = json.dumps(value, separators=(", ", ": "))
        cell = text.replace("|", "\\|")
        lines.append(f"| `{key}` | {_type(value)} | `{default}` | {cell} |")
    return "\n".join(lines)


def render(readme: str, values_text: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"gen_chart_readme: the README has no {START} ... {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(values_text)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    parser.add_argument("--chart", type=Path, default=CHART)
    args = parser.parse_args(argv)
    readme_path = args.chart / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    text = render(readme, (args.chart / "values.yaml").read_text(encoding="utf-8"))
    if args.check:
        if text != readme:
            print(f"{readme_path} is stale: run `make chart-readme`", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
