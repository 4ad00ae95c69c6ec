"""Copy the CRDs from the top-level crds/ (the single source of truth) into the Helm chart.

Helm installs whatever is in the chart's own crds/ folder, so the chart carries a byte-identical
copy; so do the CRDs-only chart helm/packrat-crds (in its templates/, which upgrades update) and
the operator's package (packrat/controller/api/crds/, whose schemas check specs).
`make crds-sync` runs this; `--check` only reports drift (a unit test enforces identity).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "crds"
TARGET = ROOT / "helm" / "packrat-operator" / "crds"
# The CRDs-only chart keeps them in templates/, so that `helm upgrade` updates them (Helm never
# upgrades a chart's crds/ folder).
CRDS_CHART = ROOT / "helm" / "packrat-crds" / "templates"
# The operator checks specs against the CRDs' schemas (packrat.controller.api.schema), so the
# package carries them too (package data; the operator image has no crds/ folder).
PACKAGE = ROOT / "operator" / "packrat" / "controller" / "api" / "crds"
TARGETS = (TARGET, CRDS_CHART, PACKAGE)


def crd_files(folder: Path) -> dict[str, bytes]:
    """Name -> bytes of every CRD manifest (*.yaml, *.yml) in ``folder``."""
    if not folder.is_dir():
        return {}
    return {
        path.name: path.read_bytes()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix in {".yaml", ".yml"}
    }


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def drift(*, source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Human-readable differences between the two folders (empty when in sync)."""
    want, have = crd_files(source), crd_files(target)
    src, dst = _rel(source), _rel(target)
    problems = [f"missing in {dst}: {name}" for name in sorted(want.keys() - have.keys())]
    problems += [f"stale in {dst}: {name}" for name in sorted(have.keys() - want.keys())]
    problems += [
        f"{dst / name} differs from {src / name}"
        for name in sorted(want.keys() & have.keys())
        if want[name] != have[name]
    ]
    return problems


def sync(*, source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Make ``target`` an exact copy of ``source``'s CRD files; returns what changed."""
    changes = drift(source=source, target=target)
    if not crd_files(source):
        raise SystemExit(f"sync_crds: no CRD manifests in {source}")
    target.mkdir(parents=True, exist_ok=True)
    want = crd_files(source)
    for name in crd_files(target).keys() - want.keys():
        (target / name).unlink()
    for name in want:
        shutil.copyfile(source / name, target / name)
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = [line for target in TARGETS for line in drift(target=target)]
        for line in problems:
            print(f"sync_crds: {line}", file=sys.stderr)
        if problems:
            print("sync_crds: run `make crds-sync`", file=sys.stderr)
        return 1 if problems else 0
    for target in TARGETS:
        for line in sync(target=target):
            print(f"sync_crds: fixed {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
