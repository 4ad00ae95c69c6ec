"""``packrat convert`` (the serving pod's engine init container) on bad input: one line on
stderr and exit 2, before anything is converted. Before, an --artefacts that is a file or
under one was a traceback (exit 1), a model that does not exist had every engine 'left out'
with exit 0 (the pod started and served without its engines), --engines ',,,' did nothing
with exit 0, and --threads 100000 crashed the check's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.cli import main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--artefacts", "{file}"], "--artefacts"),
        (["--artefacts", "{file}/under"], "--artefacts"),
        (["--model", "{tmp}"], "unknown model"),
        (["--model", "{tmp}/nosuch"], "unknown model"),
        (["--engines", ",,,"], "no engine named"),
        (["--threads", "100000"], "--threads must be in 1..256"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    args = {"--model": "tiny", "--engines": "onnxruntime", "--artefacts": str(tmp_path / "a")}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        args[flag] = value.format(file=file, tmp=tmp_path)
    argv = ["convert", *(x for kv in args.items() for x in kv)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "a").exists()  # nothing converted
