"""The serving seam: what a runtime backend does for the pod, and the two that implement it.

The backend contract (the dispatcher and the pod rely on nothing else):

- **one endpoint per plan instance**: :meth:`RuntimeBackend.forward` takes one request for the
  instance of that name and returns its answer (status, content type and body as the model
  made them; a 503 when the instance cannot be reached);
- **pinned**: :meth:`~RuntimeBackend.add` starts the instance's worker pinned to its cores with
  its thread count, before it loads anything, and returns once the worker is loaded;
- **ready only when warm**: :meth:`~RuntimeBackend.workers` reports the worker's status and pid;
  the pod warms every new pid with a batch (of one) before it marks the instance up
  (:mod:`packrat.serve.pod.health`);
- **restarted when it dies**: the backend starts a dead worker again by itself, and the requests
  it held are answered (never left hanging);
- **switchable in place**: instances are added and removed by name while others serve
  (:mod:`packrat.serve.pod.inpod`).

Two backends: :class:`TorchServeRuntime` (TorchServe on loopback; its Java frontend batches and
its Python workers run Packrat's handler) and
:class:`~packrat.serve.native.runtime.NativeRuntime` (workers forked from the zygote, fed batches
over a Unix socket by the dispatcher's process). :func:`make_runtime` builds the one a pod
asks for; both prepare the model the same way (a zoo model, a TorchScript file or a user's
``.mar``), so one archive serves on either.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from packrat.serve.config import (
    JVM_ARGS,
    InstanceSpec,
    WorkerState,
    registration_query,
)
from packrat.serve.dispatcher.upstream import Upstream
from packrat.serve.native.runtime import NativeRuntime
from packrat.serve.native.worker import ARCHIVE_FILE
from packrat.serve.torchserve.archive import (
    MANIFEST,
    ArchiveError,
    build_archive,
    is_mar,
    wrap_mar,
)
from packrat.serve.torchserve.handler import CONFIG_ENV, MODEL_FILE, WRAPPED_FILE
from packrat.serve.torchserve.process import TorchServe
from packrat.serve.zygote.process import ZygoteProcess

__all__ = ["RuntimeBackend", "TorchServeRuntime", "make_runtime", "native_model_dir"]

Inputs = list[dict[str, object]] | None


class RuntimeBackend(Protocol):
    """The backend contract (see the module)."""

    kind: str

    @property
    def running(self) -> bool:
        """False once the runtime is gone for good (the pod then exits, status 1)."""
        ...

    async def start(self) -> None: ...
    async def load_model(self, spec: str, name: str) -> Inputs:
        """Prepare the model for the instances; its inputs (None for a user's .mar)."""
        ...

    async def add(self, inst: InstanceSpec) -> None: ...
    async def remove(self, name: str) -> None: ...
    async def workers(self, name: str) -> list[WorkerState]: ...
    async def ping(self, *, timeout_s: float = 2.0) -> bool: ...
    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response: ...
    async def stop(self) -> None: ...
    def log_tail(self, lines: int = 30) -> str: ...


class TorchServeRuntime:
    """TorchServe on loopback: one registration with one pinned worker per instance."""

    kind = "torchserve"

    def __init__(
        self,
        *,
        workdir: Path,
        settings: Path,
        max_batch_delay_ms: int,
        port_base: int | None = None,
        worker_python: Path | None = None,
        jvm_args: Sequence[str] = JVM_ARGS,
        zygote: ZygoteProcess | None = None,
    ) -> None:
        self.workdir = workdir
        self.ts = TorchServe(
            workdir=workdir,
            env={CONFIG_ENV: str(settings)},
            port_base=port_base,
            worker_python=worker_python,
            jvm_args=jvm_args,
        )
        self.upstream = Upstream(self.ts.inference_url)
        self.max_batch_delay_ms = max_batch_delay_ms
        self.zygote = zygote
        self.mar: str | None = None

    @property
    def running(self) -> bool:
        return self.ts.proc is None or self.ts.running  # not started yet counts as alive

    async def start(self) -> None:
        await self.ts.start()
        self.upstream.base_url = self.ts.inference_url  # its ports are known now
        await self.upstream.start()

    async def load_model(self, spec: str, name: str) -> Inputs:
        archive = await asyncio.to_thread(
            build_archive, spec, workdir=self.workdir / "archive", name=name
        )
        self.mar = self.ts.add_archive(archive.path)
        return archive.inputs

    async def add(self, inst: InstanceSpec) -> None:
        """Register ``inst``; its launcher waits for the zygote, if any, by itself."""
        assert self.mar is not None, "load_model first"
        await self.ts.register(
            registration_query(inst, mar=self.mar, max_batch_delay_ms=self.max_batch_delay_ms)
        )

    async def remove(self, name: str) -> None:
        await self.ts.unregister(name)

    async def workers(self, name: str) -> list[WorkerState]:
        return await self.ts.workers(name)

    async def ping(self, *, timeout_s: float = 2.0) -> bool:
        return await self.ts.ping(timeout_s=timeout_s)

    async def forward(
        self, name: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> web.Response:
        return await self.upstream.forward(name, headers, query, body)

    async def stop(self) -> None:
        await self.upstream.close()
        await self.ts.stop()

    def log_tail(self, lines: int = 30) -> str:
        return self.ts.log_tail(lines)


class _NativeBackend(NativeRuntime):
    """The native runtime, preparing its model directory like TorchServe's archive."""

    async def load_model(self, spec: str, name: str) -> Inputs:
        kind, inputs = await asyncio.to_thread(native_model_dir, spec, self.model_dir, name=name)
        self.model_kind = kind
        return inputs

    async def add(self, inst: InstanceSpec) -> None:
        if self.zygote is not None:
            await self.zygote.wait_ready()  # workers are forked from it: it must listen
        await super().add(inst)


def native_model_dir(spec: str, model_dir: Path, *, name: str) -> tuple[str, Inputs]:
    """Write what a native worker loads into ``model_dir`` (replaced): ``packrat_model.json``
    (and the TorchScript file) for a zoo model or file, or a user's ``.mar`` unpacked with its
    own handler named in the manifest (checked and copied by the same code as for TorchServe:
    :func:`~packrat.serve.torchserve.archive.wrap_mar`). Returns the kind and the inputs."""
    from packrat.runtime import modelid
    from packrat.runtime.mar import HandlerError, extract_archive

    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    if is_mar(spec):
        staging = model_dir.with_name(model_dir.name + "-mar")
        staging.mkdir(parents=True, exist_ok=True)
        wrapped = wrap_mar(Path(spec), workdir=staging, name=name)  # bounded, validated
        try:
            _, manifest = extract_archive(wrapped.path, model_dir)
        except HandlerError as exc:
            raise ArchiveError(str(exc)) from None
        manifest["model"]["handler"] = wrapped.wrapped_handler
        (model_dir / MANIFEST).write_text(json.dumps(manifest))
        (model_dir / WRAPPED_FILE).unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        archive = {"model": modelid.model_name(spec), "digest": modelid.file_digest(Path(spec))}
        (model_dir / ARCHIVE_FILE).write_text(json.dumps(archive))  # finds its artefacts
        return "mar", None
    inputs: Any = modelid.zoo_input_spec(spec)  # torch-free for a zoo model
    doc: dict[str, Any] = {"spec": spec, "inputs": inputs}
    if not modelid.is_zoo_name(spec):
        from packrat.runtime import zoo  # a file is described (and checked) by loading it

        source = Path(spec)
        if not source.is_file():
            raise ArchiveError(f"{spec}: no such model file")
        try:
            inputs = zoo.input_spec(spec)
        except zoo.ZooError as exc:
            raise ArchiveError(str(exc)) from None
        if source.suffix.lower() == ".onnx":  # with its checked external data
            from packrat.runtime.engines.onnx_file import copy_model

            copy_model(source, model_dir / source.name)
        else:
            shutil.copyfile(source, model_dir / source.name)
        doc = {"spec": source.name, "file": True, "inputs": inputs}
    (model_dir / MODEL_FILE).write_text(json.dumps(doc))
    return "model", inputs


def make_runtime(
    kind: str,
    *,
    workdir: Path,
    settings: Path,
    max_batch_delay_ms: int,
    weights: Path | None,
    zygote: ZygoteProcess | None,
    port_base: int | None = None,
    jvm_args: Sequence[str] = JVM_ARGS,
) -> RuntimeBackend:
    """The pod's runtime backend: ``"native"`` or ``"torchserve"``."""
    if kind == "torchserve":
        worker_python = zygote.start() if zygote is not None else None
        return TorchServeRuntime(
            workdir=workdir,
            settings=settings,
            max_batch_delay_ms=max_batch_delay_ms,
            port_base=port_base,
            worker_python=worker_python,
            jvm_args=jvm_args,
            zygote=zygote,
        )
    if kind != "native":
        raise ValueError(f"unknown runtime {kind!r} (native or torchserve)")
    if zygote is not None:
        zygote.start()
    return _NativeBackend(
        workdir=workdir,
        model_dir=workdir / "native-model",
        model_kind="model",
        weights=weights,
        zygote=zygote,
        max_batch_delay_ms=max_batch_delay_ms,
        env={CONFIG_ENV: str(settings)},
    )
