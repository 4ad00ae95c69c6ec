"""Wrapping a user's .mar so its workers pin themselves first; model names."""

from __future__ import annotations

import json
import os
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from packrat.serve.torchserve.archive import ArchiveError, default_model_name, wrap_mar
from packrat.serve.torchserve.handler import ENTRY_MODULE, WRAPPED_FILE, instance_settings


def _user_mar(path: Path, handler: str = "my_handler.py") -> Path:
    manifest = {"model": {"modelName": "resnet", "handler": handler, "modelVersion": "1.0"}}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        z.writestr("my_handler.py", "def handle(data, context):\n    return data\n")
        z.writestr("weights.bin", b"\x00" * 16)
    return path


def test_wrap_mar_replaces_the_handler_and_keeps_every_file(tmp_path: Path) -> None:
    src = _user_mar(tmp_path / "resnet.mar", handler="my_handler:handle")
    before = src.read_bytes()
    (tmp_path / "w").mkdir()
    out = wrap_mar(src, workdir=tmp_path / "w", name="resnet")
    assert src.read_bytes() == before  # the user's archive is untouched
    assert out.wrapped_handler == "my_handler:handle"
    with zipfile.ZipFile(out.path) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        wrapped = json.loads(z.read(WRAPPED_FILE))
        entry = z.read(f"{ENTRY_MODULE}.py").decode()
    assert {"my_handler.py", "weights.bin"} <= names
    assert manifest["model"]["handler"] == f"{ENTRY_MODULE}.py"
    assert wrapped == {"handler": "my_handler:handle"}
    assert "from packrat.serve.torchserve.handler import handle" in entry


def test_wrapping_twice_keeps_the_original_handler(tmp_path: Path) -> None:
    first = wrap_mar(_user_mar(tmp_path / "m.mar"), workdir=tmp_path, name="m1")
    second = wrap_mar(first.path, workdir=tmp_path, name="m2")
    assert second.wrapped_handler == "my_handler.py"


def test_invalid_archives(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no such"):
        wrap_mar(tmp_path / "missing.mar", workdir=tmp_path, name="x")
    bad = tmp_path / "bad.mar"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ArchiveError, match="not a valid"):
        wrap_mar(bad, workdir=tmp_path, name="x")
    no_handler = tmp_path / "nh.mar"
    with zipfile.ZipFile(no_handler, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {}}))
    with pytest.raises(ArchiveError, match="no handler"):
        wrap_mar(no_handler, workdir=tmp_path, name="x")


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("resnet50", "resnet50"),
        ("zoo:bert-base", "bert-base"),
        ("/models/my model.mar", "my-model"),
        ("./m/resnet.pt", "resnet"),
    ],
)
def test_default_model_name(spec: str, name: str) -> None:
    assert default_model_name(spec) == name


def test_instance_settings_lookup(tmp_path: Path) -> None:
    cfg = tmp_path / "w.json"
    cfg.write_text(json.dumps({"instances": {"m_i0": {"cpus": [1], "threads": 1, "batch": 2}}}))
    assert instance_settings("m_i0", str(cfg)) == {"cpus": [1], "threads": 1, "batch": 2}
    assert instance_settings("m", str(cfg)) is None
    assert instance_settings("m_i0", None) is None
    assert instance_settings("m_i0", "") is None


def _mar_with(path: Path, manifest: object, **entries: bytes) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        for name, data in entries.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize(
    "manifest",
    [
        [1, 2],
        "model",
        {"model": "resnet"},
        {"model": {"handler": 7}},
        {"model": {"handler": ["h.py"]}},
        {"model": {"handler": "  "}},
        {"model": None},
    ],
)
def test_malformed_manifests_are_archive_errors(tmp_path: Path, manifest: object) -> None:
    """These raised AttributeError/TypeError tracebacks before."""
    mar = _mar_with(tmp_path / "m.mar", manifest)
    with pytest.raises(ArchiveError) as info:
        wrap_mar(mar, workdir=tmp_path, name="x")
    assert "\n" not in str(info.value) and str(mar) in str(info.value)


def test_manifest_that_is_not_json_or_not_utf8(tmp_path: Path) -> None:
    for i, raw in enumerate([b"{", b"\xff\xfe", b"[" * 100_000]):
        mar = tmp_path / f"m{i}.mar"
        with zipfile.ZipFile(mar, "w") as z:
            z.writestr("MAR-INF/MANIFEST.json", raw)
        with pytest.raises(ArchiveError, match="not valid JSON"):
            wrap_mar(mar, workdir=tmp_path, name="x")


def test_a_wrapped_archive_with_a_broken_record(tmp_path: Path) -> None:
    mar = _mar_with(
        tmp_path / "w.mar",
        {"model": {"handler": f"{ENTRY_MODULE}.py"}},
        **{WRAPPED_FILE: b'{"handler": 3}'},
    )
    with pytest.raises(ArchiveError, match="names no handler"):
        wrap_mar(mar, workdir=tmp_path, name="x")


def test_a_zip_bomb_entry_is_refused_without_expanding_it(tmp_path: Path) -> None:
    """64 MiB of zeros deflate to ~64 KB; the old code read the whole entry into memory."""
    mar = tmp_path / "bomb.mar"
    manifest = {"model": {"handler": "h.py"}}
    with zipfile.ZipFile(mar, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        with z.open("weights.bin", "w") as f:
            chunk = b"\x00" * (1 << 20)
            for _ in range(64):
                f.write(chunk)
    assert mar.stat().st_size < 1 << 20
    (tmp_path / "w").mkdir()
    with pytest.raises(ArchiveError, match="zip bomb"):
        wrap_mar(mar, workdir=tmp_path / "w", name="x")
    assert not (tmp_path / "w" / "x.mar").exists()


def test_entries_are_streamed_not_read_whole(tmp_path: Path) -> None:
    big = os.urandom(16 << 20)  # incompressible, like real weights
    mar = _mar_with(tmp_path / "big.mar", {"model": {"handler": "h.py"}}, **{"w.bin": big})
    (tmp_path / "w").mkdir()
    tracemalloc.start()
    try:
        out = wrap_mar(mar, workdir=tmp_path / "w", name="big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    with zipfile.ZipFile(out.path) as z:
        assert z.read("w.bin") == big
