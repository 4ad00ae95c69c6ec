"""docs/measurements.md as a reader uses it: every link into it lands on a section, every
benchmark script it (or the Makefile) names exists, and every script that says which figure it
makes (``FIGURE``, shown by its ``--help``) names a section that is there."""

from __future__ import annotations

import re
from pathlib import Path

from packaging_support import DOCS_DIR, ROOT

MEASUREMENTS = DOCS_DIR / "measurements.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors() -> set[str]:
    text = MEASUREMENTS.read_text(encoding="utf-8")
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_slug_is_githubs() -> None:
    assert _slug("Does following the load (autoBatch) beat a static plan?") == (
        "does-following-the-load-autobatch-beat-a-static-plan"
    )
    assert _slug("How long does fetching a `storageUri` model take?") == (
        "how-long-does-fetching-a-storageuri-model-take"
    )


def test_every_link_into_the_measurements_lands_on_a_section() -> None:
    links = [
        (doc, anchor)
        for doc in [ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]
        for anchor in re.findall(
            r"\(#([\w-]+)\)" if doc == MEASUREMENTS else r"measurements\.md#([\w-]+)",
            doc.read_text(encoding="utf-8"),
        )
    ]
    assert len(links) > 20  # the index at the top of measurements.md and the other docs' links
    anchors = _anchors()
    assert [f"{d.relative_to(ROOT)}: #{a}" for d, a in links if a not in anchors] == []


def test_every_section_is_in_the_index() -> None:
    text = MEASUREMENTS.read_text(encoding="utf-8")
    index = set(re.findall(r"\]\(#([\w-]+)\)", text.split("\n## ", 1)[0]))
    sections = [_slug(h) for h in re.findall(r"^## (.+)$", text, flags=re.M)]
    assert [s for s in sections if s not in index] == []


def test_every_benchmark_script_named_exists() -> None:
    named = {
        path
        for source in (MEASUREMENTS, ROOT / "Makefile")
        for path in re.findall(r"benchmarks/[\w/]+\.py", source.read_text(encoding="utf-8"))
    }
    assert named, "the measurements name their scripts"
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


def test_every_figure_a_script_names_is_a_section() -> None:
    anchors = _anchors()
    scripts = sorted((ROOT / "benchmarks").glob("*/*.py"))
    named = {str(p.relative_to(ROOT)): re.findall(r"\(#([\w-]+)\)", _figure(p)) for p in scripts}
    assert len(named) >= 30  # the scripts grouped by question
    assert sorted(k for k, v in named.items() if not v) == [], "every script names its figure"
    assert {k: v for k, v in named.items() if not set(v) <= anchors} == {}


def _figure(path: Path) -> str:
    match = re.search(r"^FIGURE = \((.*?)^\)", path.read_text(encoding="utf-8"), re.M | re.S)
    return match.group(1) if match else ""
