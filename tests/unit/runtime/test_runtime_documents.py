"""One bounded read for the documents a user hands in (profiles, plans, ``--inputs``, router
configs) and one JSON parse with a one-line reason (:mod:`packrat.runtime.documents`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.runtime.documents import DocumentError, loads_json, read_capped, read_capped_text


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(b"x" * 10)
    assert read_capped(path, 10) == b"x" * 10
    with pytest.raises(DocumentError, match="^larger than 9 bytes$"):
        read_capped(path, 9)


def test_an_endless_file_is_refused_after_the_cap() -> None:
    with pytest.raises(DocumentError, match="larger than 64 bytes"):
        read_capped(Path("/dev/zero"), 64)


def test_a_missing_file_says_why_in_a_phrase(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="^cannot read: No such file or directory$"):
        read_capped_text(tmp_path / "missing.json", 100)


def test_text_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"abc\xe9")
    with pytest.raises(DocumentError, match=r"^not UTF-8 text \(byte 3\)$"):
        read_capped_text(path, 100)
    path.write_bytes("threads,batch\n1,1 é\n".encode())
    assert read_capped_text(path, 100).endswith("é\n")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{\n  1", "invalid JSON at line 2: Expecting property name"),
        ("[" * 100_000, "invalid JSON: nested too deeply"),
        ("1" * 5000, "invalid JSON: Exceeds the limit"),
    ],
)
def test_json_that_does_not_parse_is_one_phrase(text: str, reason: str) -> None:
    with pytest.raises(DocumentError) as caught:
        loads_json(text)
    assert str(caught.value).startswith(reason)
    assert "\n" not in str(caught.value)


def test_json_errors_start_with_the_callers_words() -> None:
    assert loads_json(b'{"a": [1]}') == {"a": [1]}
    with pytest.raises(DocumentError, match="^plan is not valid JSON at line 1: "):
        loads_json("{", invalid="plan is not valid JSON")
