"""One TorchServe process on loopback: start, register instances, watch workers, stop.

Several TorchServes may run side by side (tests, benchmarks, two slots on a laptop), so each
gets its own work directory holding its ``TMPDIR`` (pid file), ``java.io.tmpdir`` (worker
sockets), logs and model store, and its own free loopback ports, initial worker port
included. The whole process group is stopped on exit, workers included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from packrat.serve.config import LOOPBACK, Ports, render_properties, torchserve_settings

log = logging.getLogger(__name__)


class TorchServeError(RuntimeError):
    """TorchServe did not start, or refused a registration."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def allocate_ports() -> Ports:
    p = free_ports(6)
    # Worker ports count up from the base (one per worker); leave room above it.
    return Ports(
        inference=p[0],
        management=p[1],
        metrics=p[2],
        grpc_inference=p[3],
        grpc_management=p[4],
        worker_base=20000 + (p[5] % 20000),
    )


def _torchserve_binary() -> str:
    candidate = Path(sys.executable).with_name("torchserve")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("torchserve")
    if found:
        return found
    raise TorchServeError("torchserve is not installed (pip install torchserve)")


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker of one registered model, as the management API describes it."""

    status: str
    pid: int | None

    @property
    def ready(self) -> bool:
        return self.status == "READY"


class TorchServe:
    """A TorchServe process owned by this object."""

    def __init__(
        self,
        *,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        default_workers: int | None = 1,
        job_queue_size: int = 1000,
        affinity: Sequence[int] | None = None,
    ) -> None:
        self.workdir = workdir
        self.affinity = set(affinity) if affinity else None
        self.model_store = workdir / "model-store"
        self.tmpdir = workdir / "tmp"
        self.logdir = workdir / "logs"
        self.ports = allocate_ports()
        self.extra_env = dict(env or {})
        self.default_workers = default_workers
        self.job_queue_size = job_queue_size
        self.proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def inference_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.inference}"

    @property
    def management_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.management}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.metrics}"

    def add_archive(self, mar: Path) -> str:
        """Put ``mar`` into the model store; returns the name to register it by."""
        self.model_store.mkdir(parents=True, exist_ok=True)
        target = self.model_store / mar.name
        if target.resolve() != mar.resolve():
            shutil.copyfile(mar, target)
        return mar.name

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "torchserve.out"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def start(self, *, timeout_s: float = 120.0) -> None:
        for d in (self.model_store, self.tmpdir, self.logdir):
            d.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.properties"
        config.write_text(
            render_properties(
                torchserve_settings(
                    ports=self.ports,
                    model_store=str(self.model_store),
                    tmpdir=str(self.tmpdir),
                    default_workers=self.default_workers,
                    job_queue_size=self.job_queue_size,
                )
            )
        )
        env = {
            **os.environ,
            "TMPDIR": str(self.tmpdir),
            "LOG_LOCATION": str(self.logdir),
            "METRICS_LOCATION": str(self.logdir),
            "TS_DISABLE_TOKEN_AUTHORIZATION": "true",
            **self.extra_env,
        }
        cmd = [
            _torchserve_binary(),
            "--start",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--ts-config",
            str(config),
            "--model-store",
            str(self.model_store),
        ]
        out = (self.workdir / "torchserve.out").open("wb")
        preexec: Callable[[], None] | None = None
        if self.affinity:
            cpus = self.affinity

            def preexec() -> None:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() takes the workers too
            preexec_fn=preexec,  # noqa: PLW1509 (only sched_setaffinity, no locks taken)
        )
        out.close()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TorchServeError(
                    f"TorchServe exited with status {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                async with self.session.get(
                    f"{self.management_url}/models", timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    if resp.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.2)
        raise TorchServeError(f"TorchServe did not start in {timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise TorchServeError("TorchServe is not started")
        return self._session

    async def register(self, query: Mapping[str, str], *, timeout_s: float = 600.0) -> None:
        """``POST /models`` (synchronous): returns once the workers are up."""
        async with self.session.post(
            f"{self.management_url}/models",
            params=dict(query),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise TorchServeError(
                    f"registering {query.get('model_name')} failed ({resp.status}): {text}\n"
                    f"{self.log_tail()}"
                )

    async def workers(self, name: str) -> list[WorkerInfo]:
        """The workers of model ``name`` (empty when unknown or unreachable)."""
        try:
            async with self.session.get(
                f"{self.management_url}/models/{name}", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                if resp.status != 200:
                    return []
                data: Any = json.loads(await resp.text())
        except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError):
            return []
        out = []
        for model in data if isinstance(data, list) else [data]:
            for worker in model.get("workers", []):
                pid = worker.get("pid")
                out.append(
                    WorkerInfo(
                        status=str(worker.get("status")), pid=pid if pid and pid > 0 else None
                    )
                )
        return out

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, *, timeout_s: float = 20.0) -> None:
        """Stop TorchServe and its workers (the whole process group)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # The JVM may exit before its workers: make sure none survives.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=5)
        self.proc = None
