"""Converted artefacts, once per (model digest, engine, engine version, input specs).

The profiling Job converts; the profile records where the artefact is; every pod and every
later profile of the same model finds it by the same key and loads it, never converting
again. A conversion is written to a temporary folder beside its final one and renamed into
place, so a reader sees a complete artefact or none, and two Jobs racing both end with one.

Layout under the cache root (where the pods read weights)::

    <model>-<digest16>/<engine>-<version>-<specs12>/artefact.json   (the manifest)
                                                    model.xml ...    (the engine's files)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from packrat.runtime.engines.base import Engine, EngineError, InputSpec, specs_digest
from packrat.runtime.mar import is_archive

MANIFEST = "artefact.json"
FORMAT = "packrat.artefact/v1"


@dataclass(frozen=True, slots=True)
class Artefact:
    """A converted model: its engine, its file (None for eager) and how it was made."""

    engine: str
    """The engine's name (``eager``, ``onnxruntime``, ``openvino``, ``inductor``)."""
    version: str
    """The version of the engine's library that converted it. Part of the cache key: where
    another version runs, the profiling Job converts again and a pod finds nothing to load."""
    model_digest: str
    """The digest of the model it was converted from (``sha256:<hex>``)."""
    inputs: tuple[InputSpec, ...]
    """The input specs it was converted for (:func:`specs_digest` of them ends its folder's
    name: the same model with other input shapes is converted again)."""
    path: Path | None
    """The file the engine loads, in :attr:`folder`; None for an engine that converts nothing
    (eager)."""
    folder: Path | None
    """Its folder, ``<root>/<model>-<digest16>/<engine>-<version>-<specs12>/``
    (:func:`artefact_folder`): the manifest (``artefact.json``) and the engine's files."""
    conversion_s: float = 0.0
    """Seconds the conversion took, when it was made (the manifest keeps it for later finds)."""
    converted_now: bool = False
    """True: converted by this call; False: found in the cache."""

    def to_record(self) -> dict[str, Any]:
        """As the profile records it (``meta.extra.engines.<name>.artefact``)."""
        return {
            "engine": self.engine,
            "version": self.version,
            "path": None if self.path is None else str(self.path),
            "conversion_s": round(self.conversion_s, 3),
        }


def model_folder(root: Path, *, name: str, digest: str) -> Path:
    """The folder of one model's artefacts, every engine's."""
    return root / f"{name}-{digest.removeprefix('sha256:')[:16]}"


def artefact_folder(
    root: Path, *, model: str, digest: str, engine: str, version: str, inputs: Sequence[InputSpec]
) -> Path:
    safe_version = "".join(c if c.isalnum() or c in ".-_" else "_" for c in version)[:40]
    return model_folder(root, name=model, digest=digest) / (
        f"{engine}-{safe_version}-{specs_digest(inputs)}"
    )


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


def converted(
    engine: Engine,
    *,
    root: Path,
    model_name: str,
    digest: str,
    inputs: Sequence[InputSpec],
    build: Callable[[], nn.Module],
) -> Artefact:
    """The engine's artefact for this model, from the cache or converted now (and cached)."""
    version = engine.version()
    specs = tuple(inputs)
    folder = artefact_folder(
        root, model=model_name, digest=digest, engine=engine.name, version=version, inputs=specs
    )
    found = _cached(engine.name, version, digest, specs, folder)
    if found is not None:
        return found
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        began = time.monotonic()
        path = engine.convert(build(), specs, tmp)
        seconds = time.monotonic() - began
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "engine": engine.name,
            "version": version,
            "model_digest": digest,
            "inputs": [i.to_dict() for i in specs],
            "file": None if path is None else path.name,
            "conversion_s": round(seconds, 3),
        }
        manifest["files"] = _fingerprints(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        lookup = functools.partial(_cached, engine.name, version, digest, specs, folder)
        if (found := _store(tmp, folder, lookup)) is not None:
            return found  # another Job finished the same conversion first: theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Artefact(
        engine=engine.name,
        version=version,
        model_digest=digest,
        inputs=specs,
        path=None if path is None else folder / path.name,
        folder=folder,
        conversion_s=seconds,
        converted_now=True,
    )


def _store(tmp: Path, folder: Path, lookup: Callable[[], Artefact | None]) -> Artefact | None:
    """Rename the new artefact ``tmp`` to ``folder``; None when it is there now. A valid
    artefact already there (another Job's) is returned and kept; a spoiled one (truncated,
    swapped, half a manifest) is moved aside and removed, so a profiling Job heals the cache
    instead of failing on it forever."""
    try:
        os.rename(tmp, folder)
        return None
    except OSError:
        pass
    found = lookup()  # what the folder holds, if it is intact
    if found is not None:
        return found
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.spoiled.", dir=folder.parent))
    try:
        os.rename(folder, trash / "artefact")
        os.rename(tmp, folder)
    except OSError:
        raise EngineError(f"cannot store the artefact in {folder}") from None
    finally:
        shutil.rmtree(trash, ignore_errors=True)
    return None


CHUNK = 1 << 20


def _fingerprint(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _fingerprints(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file of an artefact (the manifest's ``files``), by its path
    in the folder: an ONNX model's external data and OpenVINO's ``.bin`` are checked too."""
    return {
        str(p.relative_to(folder)): _fingerprint(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def _intact(folder: Path, files: Any) -> bool:
    """Every file the manifest lists has the size and SHA-256 it was written with (a
    manifest without ``files``, from before they were recorded, is taken as it is)."""
    if files is None:
        return True
    if not isinstance(files, dict):
        return False
    for name, want in files.items():
        path = folder / str(name)
        if not isinstance(want, dict) or not path.resolve().is_relative_to(folder.resolve()):
            return False
        try:
            if path.stat().st_size != want.get("bytes") or _fingerprint(path) != want:
                return False
        except OSError:
            return False
    return True


def _cached(
    engine: str, version: str, digest: str, inputs: tuple[InputSpec, ...], folder: Path
) -> Artefact | None:
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("model_digest") != digest:
        return None
    if not _intact(folder, manifest.get("files")):
        return None  # truncated, corrupted or swapped since the profiling Job wrote it
    name = manifest.get("file")
    if name is not None and (not isinstance(name, str) or name in ("", ".", "..")
                             or Path(name).name != name):  # fmt: skip
        return None  # a file outside its folder (issue 38: "/x" or "../x" was followed)
    path = None if name is None else folder / name
    if path is not None and not path.is_file():
        return None
    return Artefact(
        engine=engine,
        version=version,
        model_digest=digest,
        inputs=inputs,
        path=path,
        folder=folder,
        conversion_s=float(manifest.get("conversion_s", 0.0)),
        converted_now=False,
    )


ARTEFACTS_ENV = "PACKRAT_ARTEFACTS"  # the serving pod's artefact folder (packrat serve --artefacts)


def find(root: Path, spec: str, engine: Engine) -> Artefact:
    """The artefact the profiling Job converted for ``spec`` (never converted here: a pod
    that cannot find it fails to load with this one line). A ``.mar``'s module inputs are
    those its profile captured (:mod:`.handler`)."""
    from packrat.runtime.zoo import model_digest, model_name

    name, digest = model_name(spec), model_digest(spec)
    if is_archive(spec):
        return find_for_archive(root, name=name, digest=digest, engine=engine)
    from packrat.runtime.engines import input_specs

    return _find(root, name=name, digest=digest, engine=engine, specs=input_specs(spec))


def find_for_archive(root: Path, *, name: str, digest: str, engine: Engine) -> Artefact:
    """:func:`find` for a ``.mar`` known by its name and digest (a serving worker's)."""
    from packrat.runtime.engines.handler import recorded_inputs

    specs = recorded_inputs(root, name=name, digest=digest)
    if specs is None:
        raise EngineError(_not_found(engine, name, root))
    return _find(root, name=name, digest=digest, engine=engine, specs=specs)


def _find(
    root: Path, *, name: str, digest: str, engine: Engine, specs: tuple[InputSpec, ...]
) -> Artefact:
    version = engine.version()
    folder = artefact_folder(
        root, model=name, digest=digest, engine=engine.name, version=version, inputs=specs
    )
    found = _cached(engine.name, version, digest, specs, folder)
    if found is None:
        raise EngineError(_not_found(engine, name, root))
    return found


def _not_found(engine: Engine, name: str, root: Path) -> str:
    return (
        f"no {engine.name} {engine.version()} artefact for {name} in {root}: profile it "
        f"with packrat profile --engines {engine.name} --artefacts {root}"
    )


def load_converted(spec: str, name: str, *, threads: int) -> tuple[Any, Path | None]:
    """A runner of engine ``name`` for ``spec`` from the folder in :data:`ARTEFACTS_ENV`."""
    chosen, root = _serving_engine(name)
    artefact = find(root, spec, chosen)
    return chosen.load(artefact.path, model=None, threads=threads), artefact.path


def load_for_archive(*, model: str, digest: str, name: str, threads: int) -> tuple[Any, Artefact]:
    """:func:`load_converted` for a ``.mar``'s module (known by the archive's name and digest)."""
    chosen, root = _serving_engine(name)
    artefact = find_for_archive(root, name=model, digest=digest, engine=chosen)
    return chosen.load(artefact.path, model=None, threads=threads), artefact


def _serving_engine(name: str) -> tuple[Engine, Path]:
    from packrat.runtime.engines import EngineMissingError, engine

    chosen = engine(name)
    missing = chosen.missing()
    if missing is not None:
        raise EngineMissingError(missing)
    root = os.environ.get(ARTEFACTS_ENV)
    if not root:
        raise EngineError(f"engine {name}: no artefact folder ({ARTEFACTS_ENV} / --artefacts)")
    return chosen, Path(root)
