"""``--inputs`` on ``packrat profile`` and ``packrat serve`` (issue 37 item 5): a declaration
that cannot be used, or one given for a model that takes none, is one line and exit 2
before anything starts; a good one reaches every process the command starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packrat.cli import main
from packrat.runtime import inputs as decl

PLAIN = '[{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]'


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(decl.ENV, "")  # restored after the test
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"cpus": 1, "batch": 1, "instances": []}))
    return path


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ('[{"name": "x", "datatype": "FP32", "shape": [16]}]', "must start with -1"),
        ("[{", "--inputs: not JSON"),
        ("@/nonexistent/inputs.json", "cannot read"),
    ],
)
def test_a_bad_declaration_is_one_line(
    tmp_path: Path, plan: Path, inputs: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.pt"
    model.write_bytes(b"not loaded: the declaration is checked first")
    for argv in (
        ["profile", "--model", str(model), "--inputs", inputs, "--cpus", "1", "-o", "p.json"],
        ["serve", "--model", str(model), "--inputs", inputs, "--plan", str(plan)],
    ):
        code, err = _run(argv, capsys)
        assert code == 2 and len(err) == 1 and says in err[0], err


def test_a_zoo_model_takes_no_inputs(plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["serve", "--model", "tiny", "--inputs", PLAIN, "--plan", str(plan)], capsys)
    assert code == 2 and len(err) == 1 and "--inputs applies to a model file" in err[0], err


def test_an_unloadable_file_is_one_line(
    tmp_path: Path, plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.pt"
    model.write_bytes(b"not a TorchScript archive")
    code, err = _run(
        ["serve", "--model", str(model), "--inputs", PLAIN, "--plan", str(plan)], capsys
    )
    assert code == 2 and len(err) == 1 and "not a loadable TorchScript file" in err[0], err
    assert decl.declared() == decl.parse_inputs(json.loads(PLAIN))  # for every started process
