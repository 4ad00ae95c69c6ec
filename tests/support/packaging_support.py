"""Helpers shared by the packaging tests (chart, images, examples, docs): render the Helm chart
offline with helm-python-sdk, walk pod specs, and check a `packrat` command line.

Not a conftest: the packaging test modules import it explicitly.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "packrat-operator"
CRD_DIR = ROOT / "crds"
EXAMPLES_DIR = ROOT / "examples"
DOCS_DIR = ROOT / "docs"
IMAGES_DIR = ROOT / "images"
# the paper's measured ResNet profile: what the CLI and planner tests plan from
RESNET_PROFILE = ROOT / "benchmarks" / "profiles" / "packrat-paper" / "resnet-pytorch.csv"
RELEASE = "prat"
NAMESPACE = "packrat-system"

# Kinds kubernetes-validate has no schema for: their shape is checked by the tests themselves.
CUSTOM_KINDS = {
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "KopfPeering",
    "ClusterKopfPeering",
}
POD_KINDS = {"Deployment", "Job", "Pod", "StatefulSet", "DaemonSet"}


@contextmanager
def helm_home(base: Path) -> Iterator[None]:
    """Point Helm's cache/config/data homes and the kube cache at ``base`` (never ~)."""
    names = ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME", "KUBECACHEDIR")
    saved = {name: os.environ.get(name) for name in names}
    try:
        for name in names:
            path = base / name.lower()
            path.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(path)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Template path -> rendered text (helm template, offline)."""
    import helm_python

    with helm_python.Chart.load(CHART_DIR) as chart:
        rendered: dict[str, str] = chart.render(
            dict(values or {}), name=name, namespace=namespace, is_install=True
        )
    return rendered


def render_objects(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render_chart(values, **kwargs).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), f"{path}: a document is not a mapping"
                objects.append(doc)
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def pod_spec(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod spec inside a workload object, or None for other kinds."""
    if obj.get("kind") == "Pod":
        spec: dict[str, Any] = obj["spec"]
        return spec
    if obj.get("kind") in POD_KINDS:
        template: dict[str, Any] = obj["spec"]["template"]["spec"]
        return template
    return None


def all_containers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Init containers and containers of a pod spec."""
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def crd_schema(path: Path | None = None) -> dict[str, Any]:
    """The PackratModel CRD's openAPIV3Schema (v1alpha1)."""
    crd = load_yaml_docs(path or CRD_DIR / "packratmodel.yaml")[0]
    for version in crd["spec"]["versions"]:
        if version["name"] == "v1alpha1":
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError("no v1alpha1 version in the CRD")


def strict_schema(schema: Any) -> Any:
    """The schema as the API server applies it with strict field validation: unknown fields fail."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def pinned_requirements() -> dict[str, str]:
    """Normalised distribution name -> exact version, for every `==` pin in pyproject.toml."""
    project = pyproject()["project"]
    specs = list(project["dependencies"])
    for group in project.get("optional-dependencies", {}).values():
        specs += group
    pins: dict[str, str] = {}
    for spec in specs:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)\s*", spec)
        if match:
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def packrat_argv(command: list[str] | None, args: list[str] | None) -> list[str] | None:
    """The argv after `packrat` a container runs, given that the images' ENTRYPOINT is
    `packrat`; None when the container runs something else."""
    if command:
        if Path(command[0]).name != "packrat":
            return None
        return [*command[1:], *(args or [])]
    return list(args or [])


def check_packrat_argv(argv: list[str]) -> str:
    """Assert ``argv`` (after `packrat`) names a real subcommand and, where that subcommand's
    module exists, that its parser accepts the arguments. Returns the subcommand."""
    import importlib

    from packrat import cli

    rest = [a for a in argv if a not in {"-v", "--verbose"}]
    assert rest, f"no subcommand in {argv}"
    sub = rest[0]
    assert sub in cli.COMMANDS, f"`packrat {sub}` is not a packrat subcommand ({cli.COMMANDS})"
    try:
        importlib.import_module(f"packrat.cli.{sub}")
    except ModuleNotFoundError as exc:
        if exc.name != f"packrat.cli.{sub}":
            raise
        return sub  # the subcommand's module is not written yet: name checked only
    parser = cli.build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on unknown or invalid arguments
        raise AssertionError(f"`packrat {' '.join(argv)}` is rejected by argparse") from exc
    return sub


#: A plan as ``packrat plan --format json`` prints it, for the manifest builders.
SAMPLE_PLAN: dict[str, Any] = {
    "cpus": 4,
    "batch": 8,
    "instances": [{"threads": 2, "batch": 4, "count": 2, "latency_ms": 10.0}],
    "expected_latency_ms": 10.0,
    "fat_latency_ms": 15.0,
    "expected_speedup": 1.5,
    "num_instances": 2,
    "total_threads": 4,
    "label": "2x2t/b4",
    "alternatives": {},
}


def load_script(name: str) -> ModuleType:
    """The repository's ``scripts/<name>.py`` loaded as a module (the scripts are not a package);
    a fresh module on every call, registered under ``_<name>`` while it runs (for dataclasses)."""
    spec = importlib.util.spec_from_file_location(f"_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
