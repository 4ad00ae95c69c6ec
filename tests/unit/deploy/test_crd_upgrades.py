"""CRD upgrades (issue 28 item 4), offline as far as they go: every CRD is kept when its chart
is uninstalled, the charts' texts name every CRD, and the documented adoption step (CRDs that
the operator chart's crds/ folder installed, handed to the packrat-crds release) really gives
each CRD the ownership Helm checks before it installs over an existing object. The adoption
commands are the ones docs/install.md quotes, run by the real kubectl on the CRD files
(``--local``: no cluster), and Helm's check is the one of its ``action`` package
(``checkOwnership``: the managed-by label and the release name and namespace annotations).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging_support import CHART_DIR, CRD_DIR, DOCS_DIR, ROOT, helm_home, load_yaml_docs

CRDS_CHART = ROOT / "helm" / "packrat-crds"
KEEP = "helm.sh/resource-policy"


def _crds() -> dict[str, dict[str, Any]]:
    """CRD name -> manifest, for every CRD in crds/."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            if doc.get("kind") == "CustomResourceDefinition":
                out[doc["metadata"]["name"]] = {**doc, "_file": path}
    return out


CRDS = _crds()


def test_every_crd_is_kept_on_uninstall(tmp_path_factory: pytest.TempPathFactory) -> None:
    helm_python = pytest.importorskip("helm_python")
    assert {"packratmodels.packrat.dev", "packratpipelines.packrat.dev"} <= CRDS.keys()
    with (
        helm_home(tmp_path_factory.mktemp("helm")),
        helm_python.Chart.load(CRDS_CHART) as chart,
    ):
        out = chart.render({}, name="packrat-crds", namespace="packrat-system")
    rendered = [
        d for k, v in out.items() if k.endswith(".yaml") for d in yaml.safe_load_all(v) if d
    ]
    assert {d["metadata"]["name"] for d in rendered} == CRDS.keys()
    for crd in rendered:
        assert crd["metadata"]["annotations"][KEEP] == "keep", crd["metadata"]["name"]


def _texts() -> dict[str, str]:
    chart = yaml.safe_load((CRDS_CHART / "Chart.yaml").read_text())
    return {
        "packrat-crds Chart.yaml description": chart["description"],
        "packrat-crds README.md": (CRDS_CHART / "README.md").read_text(),
        "packrat-operator README.md": (CHART_DIR / "README.md").read_text(),
        "packrat-operator NOTES.txt": (CHART_DIR / "templates" / "NOTES.txt").read_text(),
        "docs/install.md": (DOCS_DIR / "install.md").read_text(),
    }


def test_chart_texts_name_every_crd() -> None:
    kinds = {crd["spec"]["names"]["kind"] for crd in CRDS.values()}
    for where, text in _texts().items():
        missing = sorted(k for k in kinds if not re.search(rf"\b{k}\b", text))
        assert missing == [], f"{where} does not name {missing}"
    for where in ("packrat-crds README.md", "packrat-operator README.md", "docs/install.md"):
        text = _texts()[where]
        assert [n for n in CRDS if n not in text] == [], where
    # Artifact Hub's list of the operator chart's CRDs is every CRD, with its real version
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    listed = yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])
    assert {c["name"]: (c["kind"], c["version"]) for c in listed} == {
        name: (crd["spec"]["names"]["kind"], crd["spec"]["versions"][0]["name"])
        for name, crd in CRDS.items()
    }


# ---------------------------------------------------------------------------- adoption


def _adoption_block() -> list[list[str]]:
    text = (DOCS_DIR / "install.md").read_text()
    section = text[text.index("### Moving the CRDs to the packrat-crds chart") :]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "no adoption commands in docs/install.md"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip()]


def helm_owns(obj: dict[str, Any], *, release: str, namespace: str) -> list[str]:
    """Helm's checkOwnership: why Helm would refuse to take ``obj`` into ``release`` (empty:
    it may)."""
    meta = obj.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    problems = []
    if labels.get("app.kubernetes.io/managed-by") != "Helm":
        problems.append('label app.kubernetes.io/managed-by must be "Helm"')
    if annotations.get("meta.helm.sh/release-name") != release:
        problems.append(f'annotation meta.helm.sh/release-name must be "{release}"')
    if annotations.get("meta.helm.sh/release-namespace") != namespace:
        problems.append(f'annotation meta.helm.sh/release-namespace must be "{namespace}"')
    return problems


@pytest.fixture(scope="module")
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not installed: the adoption commands need it (offline, --local)")
    return found


def _kubectl_local(kubectl: str, argv: list[str], obj_file: Path) -> dict[str, Any]:
    """Run ``kubectl label|annotate crd NAMES... K=V... --overwrite`` on one CRD file offline."""
    verb = argv[1]
    pairs = [a for a in argv[3:] if "=" in a and not a.startswith("-")]
    flags = [a for a in argv[3:] if a.startswith("-")]
    done = subprocess.run(
        [kubectl, verb, "--local", "-f", str(obj_file), *pairs, *flags, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_adoption_step_gives_every_crd_to_the_packrat_crds_release(
    kubectl: str, tmp_path: Path
) -> None:
    commands = _adoption_block()
    edits = [c for c in commands if c[:1] == ["kubectl"] and c[1] in {"label", "annotate"}]
    install = next(c for c in commands if c[:2] == ["helm", "upgrade"] and "packrat-crds" in c)
    release = install[install.index("--install") + 1]
    namespace = install[install.index("--namespace") + 1]
    assert install.index("helm") == 0 and release == "packrat-crds"
    for edit in edits:
        assert edit[2] == "crd" and "--overwrite" in edit
        named = [a for a in edit[3:] if "=" not in a and not a.startswith("-")]
        assert sorted(named) == sorted(CRDS), f"`{' '.join(edit)}` does not name every CRD"
    for name, crd in CRDS.items():
        # as the operator chart's crds/ folder installed it (or an older release owned it)
        current = tmp_path / f"{name}.json"
        installed = {k: v for k, v in crd.items() if k != "_file"}
        assert helm_owns(installed, release=release, namespace=namespace), "vacuous"
        current.write_text(json.dumps(installed))
        for edit in edits:
            current.write_text(json.dumps(_kubectl_local(kubectl, edit, current)))
        adopted = json.loads(current.read_text())
        assert helm_owns(adopted, release=release, namespace=namespace) == [], name
        assert adopted["spec"] == installed["spec"]  # nothing else changed
        # and the release about to install them is the packrat-crds chart, kept on uninstall
        assert adopted["metadata"]["annotations"][KEEP] == "keep"
    # an object another release owns is refused by the same check
    other = {
        "metadata": {
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": "packrat",
                "meta.helm.sh/release-namespace": namespace,
            },
        }
    }
    assert helm_owns(other, release=release, namespace=namespace) == [
        'annotation meta.helm.sh/release-name must be "packrat-crds"'
    ]
