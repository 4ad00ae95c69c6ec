"""``packrat COMMAND`` builds only that command's parser (a serving pod's start waits on it),
and parses exactly as the full parser does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packrat.cli import COMMANDS, _named_command, build_parser


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["serve", "--model", "tiny"], "serve"),
        (["-v", "serve", "--plan", "p.json"], "serve"),
        (["plan", "--profile", "serve"], "plan"),  # the first word only
        (["--help"], None),
        (["--version"], None),
        (["serv", "--model", "tiny"], None),  # a typo: the full parser lists the commands
        ([], None),
    ],
)
def test_the_named_command_is_the_first_word(argv: list[str], named: str | None) -> None:
    assert _named_command(argv) == named


def test_one_command_parses_as_the_full_parser_does() -> None:
    argv = ["-v", "serve", "--model", "tiny", "--plan", "p.json", "--runtime", "torchserve"]
    assert vars(build_parser("serve").parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_packrat_serve_imports_no_other_command() -> None:
    # A fresh interpreter: what ``packrat serve`` imports before it starts the zygote.
    code = (
        "import sys; from packrat.cli import build_parser, _named_command\n"
        "build_parser(_named_command(['serve']))\n"
        "print(sorted(m for m in sys.modules if m.startswith('packrat.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['packrat.cli.serve']"
    assert "serve" in COMMANDS


def test_a_typo_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(_named_command(["serv"])).parse_args(["serv"])
    err = capsys.readouterr().err
    assert "invalid choice" in err and "operator" in err and "serve" in err
