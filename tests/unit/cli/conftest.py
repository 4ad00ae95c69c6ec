"""The CLI tests' shared set-ups."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.cli import main

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


@pytest.fixture
def refused(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str], str], str]:
    """Runs ``packrat`` with the given arguments and checks the refusal: exit 2 and one line
    on stderr that names the given words; gives that line."""

    def run(argv: list[str], message: str) -> str:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, err
        assert message in err and err.count("\n") == 1, err
        return err

    return run
