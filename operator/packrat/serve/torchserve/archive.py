"""Model archives for TorchServe: built from a zoo model or TorchScript file, or a user's .mar.

TorchServe serves ``.mar`` files. Packrat needs every worker to run its pinning handler
first, so:

- a zoo model or TorchScript file becomes an archive built with ``torch-model-archiver``
  whose handler is Packrat's entry point and whose ``packrat_model.json`` says what to load
  and how requests decode (the TorchScript file itself is shipped inside the archive);
- a user's ``.mar`` is copied with its manifest's handler replaced by Packrat's entry point
  and the original handler recorded in ``packrat_wrapped.json``: the worker pins itself,
  then loads the user's handler exactly as TorchServe would. The user's files are untouched.

Everything is written under a writable work directory (the pod's root FS is read-only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packrat.runtime import modelid
from packrat.runtime.mar import is_archive
from packrat.serve.torchserve.handler import ENTRY_MODULE, ENTRY_SOURCE, MODEL_FILE, WRAPPED_FILE

MANIFEST = "MAR-INF/MANIFEST.json"


class ArchiveError(RuntimeError):
    """The model cannot be turned into a servable archive."""


@dataclass(frozen=True, slots=True)
class ModelArchive:
    """A servable archive, made by :func:`build_archive` (a zoo model or TorchScript file) or
    :func:`wrap_mar` (a user's .mar), and what Packrat knows about its inputs."""

    path: Path
    """The ``.mar`` file written: ``<workdir>/<name>.mar``."""
    name: str
    """The model's URL name, which the archive registers it under (its ``modelName``)."""
    inputs: list[dict[str, object]] | None
    """The inputs Packrat's entry point declares; None for a user's .mar (its handler decides)."""
    wrapped_handler: str | None = None
    """A user's wrapped .mar: the handler its manifest named, run after Packrat's pinning."""


def default_model_name(spec: str) -> str:
    """The URL name of a model: the zoo name or the file stem (``/m/resnet.mar`` -> ``resnet``)."""
    base = spec.removeprefix("zoo:")
    name = Path(base).stem if ("/" in base or "." in base) else base
    return re.sub(r"[^A-Za-z0-9_-]", "-", name) or "model"


is_mar = is_archive  # serve's name for it


def _archiver() -> str:
    found = shutil.which("torch-model-archiver")
    if found:
        return found
    candidate = Path(sys.executable).with_name("torch-model-archiver")
    if candidate.exists():
        return str(candidate)
    raise ArchiveError("torch-model-archiver is not installed (pip install torch-model-archiver)")


def build_archive(spec: str, *, workdir: Path, name: str | None = None) -> ModelArchive:
    """An archive for ``spec`` (zoo name, TorchScript path or .mar) under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    name = name or default_model_name(spec)
    if is_mar(spec):
        return wrap_mar(Path(spec), workdir=workdir, name=name)
    inputs = modelid.zoo_input_spec(spec)  # torch-free for a zoo model
    if inputs is None:
        from packrat.runtime import zoo  # a file is described (and checked) by loading it

        try:
            inputs = zoo.input_spec(spec)
        except zoo.ZooError as exc:
            raise ArchiveError(str(exc)) from None
    source = workdir / f"{name}-src"
    if source.exists():
        shutil.rmtree(source)
    source.mkdir()
    entry = source / f"{ENTRY_MODULE}.py"
    entry.write_text(ENTRY_SOURCE)
    model_json: dict[str, object] = {"spec": spec, "inputs": inputs}
    cmd = [
        _archiver(),
        "--model-name",
        name,
        "--version",
        "1.0",
        "--handler",
        str(entry),
        "--export-path",
        str(workdir),
        "--force",
    ]
    if not modelid.is_zoo_name(spec):
        model_file = Path(spec)
        if not model_file.is_file():
            raise ArchiveError(f"{spec}: no such model file")
        model_json = {"spec": model_file.name, "file": True, "inputs": inputs}
        cmd += ["--serialized-file", str(model_file)]
    (source / MODEL_FILE).write_text(json.dumps(model_json))
    cmd += ["--extra-files", str(source / MODEL_FILE)]
    tmp = workdir / "archiver-tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise ArchiveError(f"torch-model-archiver failed: {proc.stderr.strip() or proc.stdout}")
    return ModelArchive(path=workdir / f"{name}.mar", name=name, inputs=inputs)


# Limits on a user's archive: entries are copied in chunks (never read whole), a small
# manifest, and no entry may expand beyond MAX_RATIO times its compressed size (a zip bomb: 1 MB
# that expands to 1 GiB) or the archive beyond MAX_TOTAL_BYTES.
CHUNK_BYTES = 1024 * 1024
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_RATIO = 200
MAX_TOTAL_BYTES = 32 * 1024**3


def _read_small(src: zipfile.ZipFile, name: str, *, mar: Path) -> bytes:
    with src.open(name) as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ArchiveError(f"{mar}: {name} is larger than {MAX_MANIFEST_BYTES} bytes")
    return data


def _json_object(data: bytes, *, mar: Path, name: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ArchiveError(f"{mar}: {name} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise ArchiveError(f"{mar}: {name} must be a JSON object, got {type(doc).__name__}")
    return doc


def read_handler(src: zipfile.ZipFile, *, mar: Path) -> tuple[dict[str, Any], str]:
    """The manifest and the handler it names (the original one for an already wrapped archive)."""
    manifest = _json_object(_read_small(src, MANIFEST, mar=mar), mar=mar, name=MANIFEST)
    model = manifest.get("model")
    if not isinstance(model, dict):
        raise ArchiveError(f"{mar}: the manifest's 'model' must be an object")
    handler = model.get("handler")
    if not isinstance(handler, str) or not handler.strip():
        raise ArchiveError(f"{mar}: the manifest names no handler (a non-empty string)")
    if handler.split(":")[0].removesuffix(".py") != ENTRY_MODULE:
        return manifest, handler
    wrapped = _json_object(_read_small(src, WRAPPED_FILE, mar=mar), mar=mar, name=WRAPPED_FILE)
    original = wrapped.get("handler")
    if not isinstance(original, str) or not original.strip():
        raise ArchiveError(f"{mar}: {WRAPPED_FILE} names no handler")
    return manifest, original


def _copy_entry(
    src: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    dst: zipfile.ZipFile,
    target: zipfile.ZipInfo,
    *,
    mar: Path,
    budget: int,
) -> int:
    """Stream one entry across; returns its size. Sizes are counted as read, not trusted."""
    limit = min(budget, max(info.compress_size * MAX_RATIO, CHUNK_BYTES))
    written = 0
    with src.open(info) as fin, dst.open(target, "w", force_zip64=True) as fout:
        while chunk := fin.read(CHUNK_BYTES):
            written += len(chunk)
            if written > limit:
                raise ArchiveError(
                    f"{mar}: entry {info.filename} expands beyond {limit} bytes "
                    f"({info.compress_size} compressed): refusing a possible zip bomb"
                )
            fout.write(chunk)
    return written


def wrap_mar(mar: Path, *, workdir: Path, name: str) -> ModelArchive:
    """A copy of a user's ``.mar`` whose workers run Packrat's pinning entry point first.

    Every malformed archive is an :class:`ArchiveError` with a one-line message.
    """
    if not mar.is_file():
        raise ArchiveError(f"{mar}: no such model archive")
    out = workdir / f"{name}.mar"
    try:
        with zipfile.ZipFile(mar) as src:
            manifest, original = read_handler(src, mar=mar)
            manifest["model"]["handler"] = f"{ENTRY_MODULE}.py"
            manifest["model"]["modelName"] = name
            budget = MAX_TOTAL_BYTES
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
                for info in src.infolist():
                    if info.filename in (MANIFEST, WRAPPED_FILE, f"{ENTRY_MODULE}.py"):
                        continue
                    if info.is_dir():
                        dst.writestr(info, b"")
                        continue
                    copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                    copy.external_attr = info.external_attr
                    copy.compress_type = zipfile.ZIP_STORED
                    budget -= _copy_entry(src, info, dst, copy, mar=mar, budget=budget)
                dst.writestr(MANIFEST, json.dumps(manifest, indent=2))
                dst.writestr(WRAPPED_FILE, json.dumps({"handler": original}))
                dst.writestr(f"{ENTRY_MODULE}.py", ENTRY_SOURCE)
    except ArchiveError:
        out.unlink(missing_ok=True)
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, OSError, EOFError) as exc:
        out.unlink(missing_ok=True)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ArchiveError(f"{mar}: not a valid TorchServe model archive ({first})") from None
    except (RuntimeError, ValueError, NotImplementedError) as exc:  # encrypted, bad compression
        out.unlink(missing_ok=True)
        raise ArchiveError(f"{mar}: cannot read the archive: {exc}") from None
    return ModelArchive(path=out, name=name, inputs=None, wrapped_handler=original)
