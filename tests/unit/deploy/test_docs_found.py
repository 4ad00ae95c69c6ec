"""Docs that disagreed with the code (shared notes, docs-found items 1, 6-12): the checks that
keep them from drifting back. (Item 1, `--request-log stdout`, is tested with the request
log; item 8, the conditions, in test_crd_as_kubectl_reads.py; the commands the docs quote run
in test_docs_commands.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_files_named_in_pyproject_exist() -> None:
    """Item 9: a comment named tests/integration/test_serve_v2.py, which does not exist."""
    named = set(re.findall(r"\b(tests/[\w/]+\.py)\b", (ROOT / "pyproject.toml").read_text()))
    assert named, "the dev extras' comments name the tests that use them"
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


def test_docs_name_no_development_machine_paths() -> None:
    """Item 12: a development machine's absolute path for raw results; they are named
    relative to the checkout."""
    found = [
        f"{doc.name}:{n}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text().splitlines(), start=1)
        if re.search(r"(?<![\w.])/(work/shared|home)/", line)
    ]
    assert found == []


def test_install_says_there_is_no_release_yet() -> None:
    """Item 10: the install guide pulled a release from a registry; none is tagged. It says so
    before the registry commands and installs from a clone until then."""
    text = (ROOT / "docs" / "install.md").read_text()
    clone = text.index("## Install from a clone (until the first release)")
    assert "No release has been tagged yet" in text[clone:]
    assert clone < text.index("oci://ghcr.io/packrat-operator/charts")
    assert "helm upgrade --install packrat-crds helm/packrat-crds" in text


def test_the_profiling_job_is_not_left_to_list() -> None:
    """Item 7: the quickstart sent users to `kubectl get jobs` after profiling; the operator
    deletes the Job once the profile is stored."""
    text = " ".join((ROOT / "docs" / "quickstart-kind.md").read_text().split())
    assert "once its profile is stored the operator deletes it" in text


def test_a_torchscript_file_says_what_it_needs() -> None:
    """Item 6: the README offered any TorchScript file; a plain torch.jit.save file needs its
    inputs declared (issue 37 item 5). The README says so and shows how (its commands run or
    parsed by test_docs_commands.py)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`torch.jit.save` file, which does not hold them, declare them with `--inputs`" in text
    assert "torch.jit.save(torch.jit.script(" in text and "--inputs @inputs.json" in text
