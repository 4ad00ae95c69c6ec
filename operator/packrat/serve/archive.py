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

from packrat.serve.handler import ENTRY_MODULE, ENTRY_SOURCE, MODEL_FILE, WRAPPED_FILE

MANIFEST = "MAR-INF/MANIFEST.json"


class ArchiveError(RuntimeError):
    """The model cannot be turned into a servable archive."""


@dataclass(frozen=True, slots=True)
class ModelArchive:
    """A servable archive and what Packrat knows about its inputs."""

    path: Path
    name: str
    inputs: list[dict[str, object]] | None  # None for a user's .mar (its handler decides)
    wrapped_handler: str | None = None


def default_model_name(spec: str) -> str:
    """The URL name of a model: the zoo name or the file stem (``/m/resnet.mar`` -> ``resnet``)."""
    base = spec.removeprefix("zoo:")
    name = Path(base).stem if ("/" in base or "." in base) else base
    return re.sub(r"[^A-Za-z0-9_-]", "-", name) or "model"


def is_mar(spec: str) -> bool:
    return spec.endswith(".mar")


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
    from packrat.runtime import zoo

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
    if not zoo.is_zoo_name(spec):
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


def wrap_mar(mar: Path, *, workdir: Path, name: str) -> ModelArchive:
    """A copy of a user's ``.mar`` whose workers run Packrat's pinning entry point first."""
    if not mar.is_file():
        raise ArchiveError(f"{mar}: no such model archive")
    try:
        with zipfile.ZipFile(mar) as src:
            manifest = json.loads(src.read(MANIFEST))
            handler = manifest.get("model", {}).get("handler")
            if not handler:
                raise ArchiveError(f"{mar}: the manifest names no handler")
            if handler.split(":")[0].removesuffix(".py") == ENTRY_MODULE:
                original = json.loads(src.read(WRAPPED_FILE))["handler"]  # already wrapped
            else:
                original = handler
            manifest["model"]["handler"] = f"{ENTRY_MODULE}.py"
            manifest["model"]["modelName"] = name
            out = workdir / f"{name}.mar"
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
                for info in src.infolist():
                    if info.filename in (MANIFEST, WRAPPED_FILE, f"{ENTRY_MODULE}.py"):
                        continue
                    dst.writestr(info, src.read(info.filename))
                dst.writestr(MANIFEST, json.dumps(manifest, indent=2))
                dst.writestr(WRAPPED_FILE, json.dumps({"handler": original}))
                dst.writestr(f"{ENTRY_MODULE}.py", ENTRY_SOURCE)
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"{mar}: not a valid TorchServe model archive ({exc})") from None
    return ModelArchive(path=out, name=name, inputs=None, wrapped_handler=original)
