"""TorchServe's class-data-sharing archive, really written and really used: the JVM started
with it has it mapped and serves as before; a file that is no archive is ignored."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from packrat.serve.torchserve import jvm
from packrat.serve.torchserve.process import TorchServe

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("java") is None, reason="needs java (TorchServe's frontend)"),
]


def test_the_archive_is_written_and_a_torchserve_starts_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = jvm.write_archive(tmp_path / "ts.jsa")
    assert archive.is_file() and archive.stat().st_size > 1_000_000
    assert list(tmp_path.glob(".*.tmp")) == []  # written atomically
    monkeypatch.setenv(jvm.ARCHIVE_ENV, str(archive))
    ts = TorchServe(workdir=tmp_path / "ts")
    assert f"-XX:SharedArchiveFile={archive}" in ts.jvm_args

    assert asyncio.run(_serves_and_maps(ts, archive)) == (True, True)
    assert list((tmp_path / "ts" / jvm.CWD).iterdir()) == []  # "." stayed empty


async def _serves_and_maps(ts: TorchServe, archive: Path) -> tuple[bool, bool]:
    """Whether it answers a ping, and whether its JVM has ``archive`` mapped."""
    try:
        await ts.start()
        assert ts.proc is not None
        javas = jvm.java_pids(ts.proc.pid)
        assert javas, "no java process in TorchServe's group"
        maps = Path(f"/proc/{javas[0]}/maps").read_text()
        return await ts.ping(), str(archive) in maps
    finally:
        await ts.stop()


def test_a_foreign_file_as_archive_only_costs_the_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bogus = tmp_path / "bogus.jsa"
    bogus.write_bytes(b"not an archive" * 1000)
    monkeypatch.setenv(jvm.ARCHIVE_ENV, str(bogus))
    ts = TorchServe(workdir=tmp_path / "ts")
    assert asyncio.run(_serves_and_maps(ts, bogus)) == (True, False)
