"""The user documentation, kept honest: the CRD reference is regenerated and compared, the
metrics reference is matched against the metrics the code defines, manifests and configs shown
in the docs are the real ones (or validate), and relative links resolve.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS30Validator
from packaging_support import DOCS_DIR, ROOT, crd_schema, load_script

SOURCE = ROOT / "operator" / "packrat"


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


# ---------------------------------------------------------------------------- CRD reference


def test_crd_reference_is_generated_from_the_crd() -> None:
    gen = load_script("gen_crd_docs")
    current = (DOCS_DIR / "crd-reference.md").read_text(encoding="utf-8")
    assert current == gen.generate(), "docs/crd-reference.md is stale: run `make docs`"


def test_crd_reference_lists_every_field_with_its_description() -> None:
    gen = load_script("gen_crd_docs")
    text = (DOCS_DIR / "crd-reference.md").read_text(encoding="utf-8")
    schema = crd_schema()
    fields = list(gen.walk(schema["properties"]["spec"], path="spec"))
    fields += list(gen.walk(schema["properties"]["status"], path="status"))
    assert len(fields) > 40
    for path, node, _ in fields:
        assert f"| `{path}` |" in text, path
        assert node.get("description"), f"{path} has no description in the CRD"
    assert "exactly one of batchSize and autoBatch must be set" in text  # CEL rules too


def test_crd_reference_check_mode_detects_drift(tmp_path: Path) -> None:
    gen = load_script("gen_crd_docs")
    out = tmp_path / "ref.md"
    assert gen.main(["-o", str(out)]) == 0
    assert gen.main(["--check", "-o", str(out)]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert gen.main(["--check", "-o", str(out)]) == 1


# ---------------------------------------------------------------------------- metrics reference

# prometheus_client's constructors, the serving metric sets' factories (counter(...), ...) or
# the operator's (per_model(Counter, ...))
_METRIC_DEF = re.compile(
    r"\b(?:self\._|per_model\(\s*)?(Counter|Gauge|Histogram|Summary|counter|gauge|histogram)"
    r"(?:\(|\s*,)\s*\"(packrat_[a-z0-9_]+)\"",
    re.S,
)


def _code_metrics() -> dict[str, str]:
    """Exposed name -> type for every Prometheus metric defined under operator/packrat."""
    found: dict[str, str] = {}
    for path in SOURCE.rglob("*.py"):
        for kind, name in _METRIC_DEF.findall(path.read_text(encoding="utf-8")):
            counter = kind.lower() == "counter"
            exposed = f"{name}_total" if counter and not name.endswith("_total") else name
            found[exposed] = kind.lower()
    return found


def _doc_metrics() -> dict[str, str]:
    text = (DOCS_DIR / "metrics.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(packrat_[a-z0-9_]+)` \| (\w+) \|", text, flags=re.M)
    return dict(rows)


def test_metrics_reference_matches_the_code() -> None:
    code, docs = _code_metrics(), _doc_metrics()
    assert len(code) >= 10, "metric definitions not found: did the layout change?"
    assert sorted(code.keys() - docs.keys()) == [], "undocumented metrics"
    assert sorted(docs.keys() - code.keys()) == [], "documented metrics that do not exist"
    assert {name: docs[name] for name in code} == code, "metric types differ"


def test_metrics_reference_queries_use_real_metrics() -> None:
    text = (DOCS_DIR / "metrics.md").read_text(encoding="utf-8")
    known = set(_code_metrics())
    for block in _code_blocks(text, "promql"):
        for name in re.findall(r"\b(packrat_[a-z0-9_]+)", block):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in known, name


# ---------------------------------------------------------------------------- quickstart


def test_quickstart_kind_config_is_the_tested_one() -> None:
    text = (DOCS_DIR / "quickstart-kind.md").read_text(encoding="utf-8")
    shown = [yaml.safe_load(b) for b in _code_blocks(text, "yaml")]
    config = yaml.safe_load((ROOT / "tests" / "e2e_kind" / "kind-config.yaml").read_text())
    assert config in shown
    kubelet = yaml.safe_load(config["nodes"][0]["kubeadmConfigPatches"][0])
    assert kubelet["cpuManagerPolicy"] == "static" and kubelet["reservedSystemCPUs"]
    assert len(config["nodes"]) == 1


def _heredoc_manifests(text: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for block in _code_blocks(text, "sh"):
        for body in re.findall(r"<<'EOF'\n(.*?)\nEOF", block, flags=re.S):
            docs.extend(d for d in yaml.safe_load_all(body) if d)
    return docs


def test_quickstart_inline_model_is_valid() -> None:
    spec_module = pytest.importorskip("packrat.controller.core.spec")
    text = (DOCS_DIR / "quickstart-kind.md").read_text(encoding="utf-8")
    models = [d for d in _heredoc_manifests(text) if d.get("kind") == "PackratModel"]
    assert models
    schema = crd_schema()
    schema["properties"]["metadata"] = {"type": "object"}
    for model in models:
        assert list(OAS30Validator(schema).iter_errors(model)) == []
        assert spec_module.validate_spec(model["spec"], name=model["metadata"]["name"]) == []


def test_quickstart_covers_the_user_journey() -> None:
    text = (DOCS_DIR / "quickstart-kind.md").read_text(encoding="utf-8")
    for step in (
        "kind create cluster --config tests/e2e_kind/kind-config.yaml",
        "helm install packrat helm/packrat-operator",
        "kubectl apply -f examples/resnet50.yaml",
        "kubectl get prm",
        "kubectl port-forward svc/resnet50 8080:8080",
        "curl -s -X POST http://127.0.0.1:8080/predictions/resnet50",
        "make images",
    ):
        assert step in text, step


# ---------------------------------------------------------------------------- troubleshooting


def test_troubleshooting_covers_the_known_failures() -> None:
    text = (DOCS_DIR / "troubleshooting.md").read_text(encoding="utf-8")
    for heading in (
        "## Serving or profiling pods are not Guaranteed",
        "## Nodes without the static CPU manager",
        "## The profiling Job fails",
    ):
        assert heading in text
    controller = "\n".join(
        p.read_text(encoding="utf-8") for p in (SOURCE / "controller").rglob("*.py")
    )
    if "ProfilingFailed" in controller:  # reasons the doc names exist in the operator
        for reason in ("ProfilingFailed", "SwitchAborted", "ActiveDeploymentDeleted", "FailedOver"):
            assert reason in text and f'"{reason}"' in controller, reason


# ---------------------------------------------------------------------------- links


@pytest.mark.parametrize("doc", sorted(DOCS_DIR.glob("*.md")), ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


# ---------------------------------------------------------------------------- architecture


def test_the_architecture_page_names_every_room_of_the_layer_contracts() -> None:
    import tomllib

    text = (DOCS_DIR / "architecture.md").read_text(encoding="utf-8")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    rooms = {
        name.strip().rsplit(".", 1)[-1]
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers"
        for layer in contract["layers"]
        for name in layer.split("|")
    }
    assert len(rooms) > 15
    missing = [r for r in sorted(rooms) if f"`{r}" not in text and f"**{r}**" not in text]
    assert missing == [], f"docs/architecture.md does not describe {missing}"


def test_no_package_folder_holds_more_than_15_modules() -> None:
    crowded = {
        str(folder.relative_to(SOURCE)): n
        for folder in [SOURCE, *(p for p in SOURCE.rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > 15
    }
    assert crowded == {}


def test_the_architecture_page_names_only_rooms_and_modules_that_exist() -> None:
    """Every module (`x.py`) and folder (`x/`) the page names exists, and its list of the
    controller's rooms is the controller's folders, no more, no fewer."""
    import re

    text = (DOCS_DIR / "architecture.md").read_text(encoding="utf-8")
    files = {p.relative_to(SOURCE).as_posix() for p in SOURCE.rglob("*.py")}
    folders = {p.relative_to(SOURCE).as_posix() + "/" for p in SOURCE.rglob("*") if p.is_dir()}
    named = set(re.findall(r"`([\w/]+\.py)`", text))
    gone = [f for f in sorted(named) if not any(x == f or x.endswith("/" + f) for x in files)]
    assert gone == [], f"docs/architecture.md names modules that do not exist: {gone}"
    dirs = set(re.findall(r"`([\w/]+/)`", text))
    missing = [
        d
        for d in sorted(dirs)
        if not (ROOT / d).is_dir() and not any(x == d or x.endswith("/" + d) for x in folders)
    ]
    assert missing == [], f"docs/architecture.md names folders that do not exist: {missing}"
    listed = set(re.findall(r"^- `(\w+)`(?: and `(\w+)`)?:", text, re.M))
    rooms = {r for pair in listed for r in pair if r}
    controller = SOURCE / "controller"
    actual = {p.name for p in controller.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == actual, f"controller rooms: page {sorted(rooms)}, code {sorted(actual)}"
