"""The container images, checked without Docker: the Dockerfiles are parsed and held to the
project's rules (multi-stage, pinned, non-root numeric user, `packrat` entrypoint, OCI labels,
read-only-root-FS friendly, CPU-only torch), and every command an image or a generated
manifest runs is shown to be a real `packrat` subcommand its parser accepts.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from packaging_support import (
    CHART_DIR,
    IMAGES_DIR,
    SAMPLE_PLAN,
    all_containers,
    check_packrat_argv,
    helm_home,
    normalise,
    packrat_argv,
    pinned_requirements,
    pod_spec,
    render_objects,
)

IMAGES = ("operator", "serving")
OCI_LABELS = {
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.source",
    "org.opencontainers.image.licenses",
}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    stage: int


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions of a Dockerfile (continuations joined, comments dropped), with stage index."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, f"{path}: dangling line continuation"
    out: list[Instruction] = []
    stage = -1
    for line in lines:
        keyword, _, value = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, value.strip(), stage))
    return out


def dockerfile(name: str) -> list[Instruction]:
    return parse_dockerfile(IMAGES_DIR / name / "Dockerfile")


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.value)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instruction
    return value


def _pairs(instructions: list[Instruction], keyword: str) -> dict[str, str]:
    """The KEY=VALUE pairs of every ``keyword`` instruction (ENV, LABEL), each with its ``=``."""
    pairs: dict[str, str] = {}
    for inst in instructions:
        if inst.keyword == keyword:
            for token in shlex.split(inst.value):
                key, sep, value = token.partition("=")
                assert sep, f"use {keyword} KEY=VALUE: {inst.value}"
                pairs[key] = value
    return pairs


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    return _pairs(instructions, "ENV")


def labels_of(instructions: list[Instruction]) -> dict[str, str]:
    return _pairs(instructions, "LABEL")


# ---------------------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("name", IMAGES)
def test_multi_stage_with_pinned_base(name: str) -> None:
    instructions = dockerfile(name)
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    stage_names = {f.value.split()[-1] for f in froms if " AS " in f.value.upper()}
    assert len(stage_names) == len(froms)
    args = {
        i.value.partition("=")[0]: i.value.partition("=")[2]
        for i in instructions
        if i.keyword == "ARG" and "=" in i.value
    }
    for inst in froms:
        ref = inst.value.split()[0]
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        if ref in stage_names:
            continue
        image, _, tag = ref.partition("@")[0].rpartition(":")
        assert image and tag and tag != "latest", f"{name}: unpinned base {ref}"
        assert re.match(r"^\d+\.\d+\.\d+-", tag), f"{name}: base tag not fully pinned: {tag}"
        # and by digest: the multi-platform index (the release workflow checks its platforms)
        assert re.fullmatch(r".+@sha256:[0-9a-f]{64}", ref), f"{name}: base not pinned by digest"
    text = (IMAGES_DIR / name / "Dockerfile").read_text()
    assert "imagetools inspect" in text  # how to move to a newer digest


@pytest.mark.parametrize("name", IMAGES)
def test_runtime_stage_is_non_root_numeric(name: str) -> None:
    runtime = final_stage(dockerfile(name))
    users = [i.value for i in runtime if i.keyword == "USER"]
    assert users, f"{name}: runtime stage has no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert int(uid) == values["runAsUser"] and int(gid) == values["runAsGroup"]
    manifests = pytest.importorskip("packrat.controller.serving.manifests")
    assert int(uid) == manifests.RUN_AS_USER  # serving/profiling pods' runAsUser


@pytest.mark.parametrize("name", IMAGES)
def test_entrypoint_is_packrat_and_cmd_is_a_real_subcommand(name: str) -> None:
    runtime = final_stage(dockerfile(name))
    entrypoints = [i for i in runtime if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1 and exec_form(entrypoints[0]) == ["packrat"]
    cmds = [i for i in runtime if i.keyword == "CMD"]
    assert len(cmds) == 1
    check_packrat_argv(exec_form(cmds[0]))
    text = (IMAGES_DIR / name / "Dockerfile").read_text()
    assert ".sh" not in text, "no shell-script entrypoints"


@pytest.mark.parametrize("name", IMAGES)
def test_oci_labels_and_read_only_root_env(name: str) -> None:
    runtime = final_stage(dockerfile(name))
    labels = labels_of(runtime)
    assert labels.keys() >= OCI_LABELS
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    env = env_of(runtime)
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert [i.value for i in runtime if i.keyword == "WORKDIR"][-1] == "/tmp"
    assert (IMAGES_DIR / name / "Dockerfile.dockerignore").exists()


def _pip_pins(instructions: Sequence[Instruction]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for inst in instructions:
        if inst.keyword == "RUN" and "pip install" in inst.value:
            for name, version in re.findall(r"([A-Za-z0-9_.\-]+)==([0-9][^\s\"'\\]*)", inst.value):
                pins[normalise(name)] = version
    return pins


def test_serving_image_cpu_torch_first_then_torchserve_and_java17() -> None:
    instructions = dockerfile("serving")
    runs = [i.value for i in instructions if i.keyword == "RUN"]
    torch_at = next(n for n, r in enumerate(runs) if "torch==2.13.0" in r)
    package_at = next(n for n, r in enumerate(runs) if "[serve,storage]" in r)
    assert torch_at < package_at, "torch must be installed explicitly, before the package"
    assert "--index-url" in runs[torch_at]
    args = {i.value.partition("=")[0]: i.value.partition("=")[2] for i in instructions}
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    pins = pinned_requirements()
    assert pins["torch"] == "2.13.0" and pins["torchserve"] == "0.12.0"
    for name, version in _pip_pins(instructions).items():
        assert pins.get(name) == version, f"{name}=={version} differs from pyproject.toml"
    runtime_runs = " ".join(i.value for i in final_stage(instructions) if i.keyword == "RUN")
    assert "openjdk-17-jre-headless" in runtime_runs
    assert env_of(final_stage(instructions))["JAVA_HOME"] == "/opt/java"
    assert "cuda.is_available()" in " ".join(runs)  # the build fails on a CUDA torch


def test_operator_image_pins_match_pyproject_and_skip_torch() -> None:
    instructions = dockerfile("operator")
    pins = pinned_requirements()
    image_pins = _pip_pins(instructions)
    assert image_pins, "operator image installs no pinned dependencies"
    for name, version in image_pins.items():
        assert pins.get(name) == version, f"{name}=={version} differs from pyproject.toml"
    # Everything the operator needs at runtime (from pyproject) is in the image.
    needed = {"kopf", "kubernetes", "prometheus-client", "pyyaml", "aiohttp", "numpy", "obstore"}
    assert needed <= image_pins.keys()
    assert "torch" not in image_pins and "torchserve" not in image_pins
    assert any("--no-deps" in i.value for i in instructions if i.keyword == "RUN")


# ---------------------------------------------------------------------------- commands


# Containers that deliberately run something other than `packrat`, each with its reason.
# A new one fails test_every_command_is_a_packrat_subcommand until it is listed (or fixed).
NON_PACKRAT_COMMANDS = {
    # helm test hook: an HTTP GET of the operator's /healthz with the Python standard library.
    ("chart", "health"): "python",
    # profiling Job: prints the finished profile JSON so the operator reads it from the pod log.
    ("controller", "publish"): "cat",
}


def _owner(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "m1", "namespace": "models", "uid": "uid-1"},
        "spec": {"model": model, "cpus": 4, "batchSize": 8, **spec},
    }


MODELS: dict[str, dict[str, Any]] = {
    "zoo": {"zoo": "resnet50"},
    "uri": {
        "uri": "https://models.example.com/resnet.mar",
        "format": "mar",
        "sampleRequest": "eA==",
    },
    "volume": {
        "volume": {"persistentVolumeClaim": {"claimName": "models"}, "path": "r/resnet.pt"},
        "format": "torchscript",
    },
}
PLAN = SAMPLE_PLAN


def controller_workloads() -> Iterator[dict[str, Any]]:
    manifests = pytest.importorskip("packrat.controller.serving.manifests")
    profile_manifests = pytest.importorskip("packrat.controller.profiling.manifests")
    parse = pytest.importorskip("packrat.controller.core.model").parse
    for model in MODELS.values():
        owner = parse(_owner(model, profiling={"threads": [1, 2, 4]}))
        yield profile_manifests.profiling_job(owner)
        yield manifests.serving_deployment(owner, slot="b", serving_hash="h" * 16, replicas=2)


def chart_workloads(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with helm_home(tmp_path):
        for values in (
            {},
            {"watchNamespaces": ["a", "b"], "operator": {"verbose": True}},
            {"peering": {"enabled": True}, "replicaCount": 2},
            {"operator": {"extraArgs": ["--max-profile-attempts=5", "--resync-seconds=10"]}},
        ):
            yield from (o for o in render_objects(values) if pod_spec(o) is not None)


def test_every_command_is_a_packrat_subcommand(tmp_path: Path) -> None:
    seen_subcommands: set[str] = set()
    seen_exceptions: set[tuple[str, str]] = set()
    sources = [("chart", w) for w in chart_workloads(tmp_path)]
    sources += [("controller", w) for w in controller_workloads()]
    for source, workload in sources:
        spec = pod_spec(workload)
        assert spec is not None
        for container in all_containers(spec):
            command, args = container.get("command"), container.get("args")
            argv = packrat_argv(command, args)
            if argv is None:
                key = (source, container["name"])
                assert key in NON_PACKRAT_COMMANDS, f"{key} runs {command}: not `packrat`"
                assert command is not None
                assert Path(command[0]).name == NON_PACKRAT_COMMANDS[key]
                seen_exceptions.add(key)
                continue
            seen_subcommands.add(check_packrat_argv(argv))
    assert {"operator", "serve", "profile", "fetch"} <= seen_subcommands
    assert seen_exceptions == set(NON_PACKRAT_COMMANDS), "stale NON_PACKRAT_COMMANDS entries"


def test_check_packrat_argv_rejects_bad_commands() -> None:
    with pytest.raises(AssertionError):
        check_packrat_argv(["no-such-subcommand"])
    from packrat import cli

    if importlib.util.find_spec("packrat.cli.plan") is not None:
        with pytest.raises(AssertionError):
            check_packrat_argv(["plan", "--no-such-flag"])
    assert "operator" in cli.COMMANDS


# ------------------------------------------------------------------ operator without torch

BLOCKED = ("torch", "torchvision", "ts", "model_archiver", "matplotlib")


class _BlockFinder(importlib.abc.MetaPathFinder):
    """Makes the packages the operator image does not install unimportable."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", maxsplit=1)[0] in BLOCKED:
            raise ImportError(f"{fullname} is not installed in the operator image")
        return None


def test_operator_command_works_without_torch() -> None:
    """The operator image installs packrat with --no-deps and without torch/TorchServe:
    `packrat operator ...` (the CLI and every controller module) must import without them."""
    hidden = {
        name: module
        for name, module in sys.modules.items()
        if name.split(".")[0] in BLOCKED or name == "packrat" or name.startswith("packrat.")
    }
    finder = _BlockFinder()
    for name in hidden:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        cli = importlib.import_module("packrat.cli")
        parser = cli.build_parser()  # imports every subcommand module that exists
        controller_dir = Path(importlib.import_module("packrat.controller").__path__[0])
        for module in sorted(controller_dir.glob("*.py")):
            importlib.import_module(f"packrat.controller.{module.stem}")
        assert parser.prog == "packrat"
        leaked = [n for n in sys.modules if n.split(".")[0] in BLOCKED]
        assert leaked == []
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "packrat" or n.startswith("packrat.")]:
            del sys.modules[name]
        sys.modules.update(hidden)


# ---------------------------------------------------------------------------- build entry points


def test_make_and_ci_build_and_run_the_e2e_test() -> None:
    from packaging_support import ROOT

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^images:", makefile, flags=re.M)
    for name in IMAGES:
        assert f"images/{name}/Dockerfile" in makefile
    assert "docker info" in makefile  # a clear message, not a docker stack trace
    assert "PACKRAT_E2E_KIND=1" in makefile
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    runs = {
        job: " ".join(step.get("run", "") for step in spec["steps"])
        for job, spec in workflow["jobs"].items()
    }
    assert "make test" in runs["test"] and "make e2e-kind" in runs["e2e-kind"]
