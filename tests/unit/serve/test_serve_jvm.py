"""TorchServe's JVM flags: the class-data-sharing archive is used when it exists, never
against the user's own sharing flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.serve.config import JVM_ARGS
from packrat.serve.torchserve import jvm


def test_an_existing_archive_is_mapped(tmp_path: Path) -> None:
    archive = tmp_path / "ts.jsa"
    archive.write_bytes(b"x")
    assert jvm.archive_args(JVM_ARGS, archive) == [f"-XX:SharedArchiveFile={archive}"]


def test_a_missing_archive_adds_nothing(tmp_path: Path) -> None:
    assert jvm.archive_args(JVM_ARGS, tmp_path / "none.jsa") == []


@pytest.mark.parametrize(
    "own", ["-XX:SharedArchiveFile=/x.jsa", "-Xshare:off", "-XX:ArchiveClassesAtExit=/y.jsa"]
)
def test_the_users_own_sharing_flags_win(tmp_path: Path, own: str) -> None:
    archive = tmp_path / "ts.jsa"
    archive.write_bytes(b"x")
    assert jvm.archive_args([*JVM_ARGS, own], archive) == []


def test_the_archive_lives_beside_the_interpreter_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(jvm.ARCHIVE_ENV, raising=False)
    assert jvm.default_archive().name == "torchserve.jsa"
    assert jvm.default_archive().parent.name == "packrat"
    monkeypatch.setenv(jvm.ARCHIVE_ENV, str(tmp_path / "a.jsa"))
    assert jvm.default_archive() == tmp_path / "a.jsa"
