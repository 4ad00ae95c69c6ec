"""``packrat convert`` (the serving pod's engine init container) and ``packrat profile
--engines`` on bad input: one line on
stderr and exit 2, before anything is converted. Before, an --artefacts that is a file or
under one was a traceback (exit 1), a model that does not exist had every engine 'left out'
with exit 0 (the pod started and served without its engines), --engines ',,,' did nothing
with exit 0, and --threads 100000 crashed the check's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packrat.cli import main

BAD: dict[str, tuple[str, str, str]] = {
    # what is wrong: the flag, its value, what the one line says
    "artefacts is a file": ("--artefacts", "{file}", "--artefacts"),
    "artefacts under a file": ("--artefacts", "{file}/under", "--artefacts"),
    "model is a folder": ("--model", "{tmp}", "unknown model"),
    "model does not exist": ("--model", "{tmp}/nosuch", "unknown model"),
    "no engine named": ("--engines", ",,,", "no engine named"),
    "threads beyond 256": ("--threads", "100000", "--threads must be in 1..256"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: Any, case: str) -> None:
    flag, value, message = BAD[case]
    file = tmp_path / "a-file"
    file.write_text("x")
    args = {"--model": "tiny", "--engines": "onnxruntime", "--artefacts": str(tmp_path / "a")}
    args[flag] = value.format(file=file, tmp=tmp_path)
    assert main(["convert", *(x for kv in args.items() for x in kv)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "a").exists()  # nothing converted


def test_profile_refuses_an_artefacts_folder_it_cannot_make_before_measuring(
    tmp_path: Path, capsys: Any
) -> None:
    """``packrat profile --engines ... --artefacts FILE`` was a traceback after the eager
    points had been measured."""
    file = tmp_path / "a-file"
    file.write_text("x")
    argv = ["profile", "--model", "tiny", "--cpus", "1", "--max-batch", "1"]
    argv += ["--engines", "onnxruntime", "--artefacts", str(file), "-o", str(tmp_path / "p.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--artefacts {file}" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()
