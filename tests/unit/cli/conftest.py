"""The CLI tests' shared set-ups."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

PROFILES = ROOT / "benchmarks" / "profiles"


@pytest.fixture
def pipeline_file(tmp_path: Path) -> Callable[[str], Path]:
    """Writes a pipeline file (its text) to a temporary folder beside the two ResNet profiles
    its stages may name (``resnet-pytorch.csv``, ``resnet-torchserve.csv``); gives its path."""

    def write(text: str) -> Path:
        path = tmp_path / "pipeline.yaml"
        path.write_text(text)
        for name in ("resnet-pytorch.csv", "resnet-torchserve.csv"):
            (tmp_path / name).write_text((PROFILES / name).read_text())
        return path

    return write
