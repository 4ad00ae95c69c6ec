"""One TorchServe process on loopback: start, register instances, watch workers, stop.

Several TorchServes may run side by side (tests, benchmarks, two slots on a laptop), so each
gets its own work directory holding its ``TMPDIR`` (pid file), ``java.io.tmpdir`` (worker
sockets), logs and model store. Ports are fixed and documented
(:func:`packrat.serve.config.fixed_ports`: 9080-9084 in a pod, outside the ephemeral range,
so no outgoing connection can take one first); where a block is taken (another TorchServe on
the same host) the next block is used, and a start that fails with "Address already in use"
is retried on the next block (:mod:`packrat.serve.torchserve.ports`). The JVM maps the
installation'
installation's
class-data-sharing archive when there is one (:mod:`packrat.serve.torchserve.jvm`). The whole
process
group is stopped on exit, workers included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from packrat.serve.config import (
    JVM_ARGS,
    LOOPBACK,
    WorkerState,
    render_properties,
    torchserve_settings,
)
from packrat.serve.torchserve.jvm import CWD, archive_args
from packrat.serve.torchserve.ports import (  # re-exported: tests and benchmarks import them here
    PORT_BASE_ENV,
    PORT_BLOCKS_TRIED,
    TorchServeError,
    allocate_ports,
    default_port_base,
    free_ports,
    ports_free,
)

__all__ = [
    "PORT_BASE_ENV",
    "PORT_BLOCKS_TRIED",
    "TorchServe",
    "TorchServeError",
    "WorkerInfo",
    "allocate_ports",
    "default_port_base",
    "free_ports",
    "ports_free",
]

# What TorchServe prints once all its listeners are bound (ModelServer.startAndWait).
STARTED_LINE = b"Model server started."
START_POLL_S = 0.05
PORT_SPREAD = 8  # a retry skips up to this many more blocks, at random

log = logging.getLogger(__name__)


_START_WITH_WORKER_PYTHON = (
    "import sys; sys.executable = sys.argv.pop(1); sys.argv[0] = 'torchserve'; "
    "from ts.model_server import start; sys.exit(start())"
)


def _torchserve_binary() -> str:
    candidate = Path(sys.executable).with_name("torchserve")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("torchserve")
    if found:
        return found
    raise TorchServeError("torchserve is not installed (pip install torchserve)")


WorkerInfo = WorkerState  # one worker of one registered model, as the management API says


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
        port_base: int | None = None,
        worker_python: Path | None = None,
        jvm_args: Sequence[str] = JVM_ARGS,
    ) -> None:
        self.workdir = workdir
        self.jvm_args = (*jvm_args, *archive_args(jvm_args))  # + the CDS archive, if made
        self.worker_python = worker_python  # what TorchServe runs as "python" for a worker
        self.affinity = set(affinity) if affinity else None
        self.model_store = workdir / "model-store"
        self.tmpdir = workdir / "tmp"
        self.logdir = workdir / "logs"
        self.port_base = port_base
        self.ports = allocate_ports(port_base)
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

    async def start(self, *, timeout_s: float = 120.0, attempts: int = 6) -> None:
        """Start and wait until the management API answers; a start that lost a port is
        retried a random few free blocks on (servers starting at once on one host would all
        take the next block again). In a pod's own network namespace the first block is free."""
        for attempt in range(attempts):
            try:
                await self._start_once(timeout_s=timeout_s)
                return
            except TorchServeError as exc:
                if "Address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                await self._reap()
                taken = self.ports
                jump = 1 + attempt + random.randrange(PORT_SPREAD)
                self.ports = allocate_ports(self.port_base, skip=jump)
                log.warning(
                    "TorchServe could not bind its ports (%d..): retrying on %d..",
                    taken.inference,
                    self.ports.inference,
                )

    async def _reap(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait)
            self.proc = None

    async def _start_once(self, *, timeout_s: float) -> None:
        for d in (self.model_store, self.tmpdir, self.logdir):
            d.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        env = {
            **os.environ,
            "TMPDIR": str(self.tmpdir),
            "LOG_LOCATION": str(self.logdir),
            "METRICS_LOCATION": str(self.logdir),
            "TS_DISABLE_TOKEN_AUTHORIZATION": "true",
            **self.extra_env,
        }
        self.proc = proc = self._spawn(self._command(config), env)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        await self._wait_until_up(proc, timeout_s)

    def _write_config(self) -> Path:
        """TorchServe's config.properties in the workdir."""
        config = self.workdir / "config.properties"
        config.write_text(
            render_properties(
                torchserve_settings(
                    ports=self.ports,
                    model_store=str(self.model_store),
                    tmpdir=str(self.tmpdir),
                    default_workers=self.default_workers,
                    job_queue_size=self.job_queue_size,
                    jvm_args=self.jvm_args,
                )
            )
        )
        return config

    def _command(self, config: Path) -> list[str]:
        launch = [_torchserve_binary()]
        if self.worker_python is not None:
            # TorchServe passes its own interpreter to the JVM as the workers' python.
            launch = [sys.executable, "-c", _START_WITH_WORKER_PYTHON, str(self.worker_python)]
        return [
            *launch,
            "--start",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--ts-config",
            str(config),
            "--model-store",
            str(self.model_store),
        ]

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start TorchServe in its own session, pinned when asked, its output to a file."""
        cwd = self.workdir / CWD  # empty: TorchServe's class path has ".", and CDS needs it so
        cwd.mkdir(parents=True, exist_ok=True)
        out = (self.workdir / "torchserve.out").open("wb")
        preexec: Callable[[], None] | None = None
        if self.affinity:
            cpus = self.affinity

            def preexec() -> None:
                os.sched_setaffinity(0, cpus)

        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() takes the workers too
            preexec_fn=preexec,  # noqa: PLW1509 (only sched_setaffinity, no locks taken)
        )
        out.close()
        return proc

    async def _wait_until_up(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Until our TorchServe announced its start and its management API answers; an
        exit, or no answer in ``timeout_s``, is a TorchServeError with its log's tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                if "Address already in use" in self.log_tail(100_000):
                    raise TorchServeError(
                        f"TorchServe could not bind its ports ({self.ports.inference}..): "
                        "Address already in use"
                    )
                raise TorchServeError(
                    f"TorchServe exited with status {proc.returncode}:\n{self.log_tail()}"
                )
            if not self._announced_start():
                # Until our own TorchServe says it bound its ports, an answer on them may
                # come from another one that took them first (it would not know our model).
                # Read often: the start is on the pod's path to ready; the file is a few KB.
                await asyncio.sleep(START_POLL_S)
                continue
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

    def _announced_start(self) -> bool:
        """Whether this TorchServe's own output says it bound every port and started."""
        try:
            with (self.workdir / "torchserve.out").open("rb") as out:
                return STARTED_LINE in out.read()
        except OSError:
            return False

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

    async def unregister(self, name: str, *, timeout_s: float = 60.0) -> None:
        """``DELETE /models/{name}``: stops its workers; a model already gone is fine."""
        async with self.session.delete(
            f"{self.management_url}/models/{name}", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            text = await resp.text()
            if resp.status not in (200, 404):
                raise TorchServeError(f"unregistering {name} failed ({resp.status}): {text}")

    async def ping(self, *, timeout_s: float = 2.0) -> bool:
        """Whether the frontend answers its health check within ``timeout_s``."""
        try:
            async with self.session.get(
                f"{self.inference_url}/ping", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, TorchServeError):
            return False

    async def workers(self, name: str, *, timeout_s: float = 2.0) -> list[WorkerInfo]:
        """The workers of model ``name`` (empty when unknown, unreachable or too slow)."""
        try:
            async with self.session.get(
                f"{self.management_url}/models/{name}",
                timeout=aiohttp.ClientTimeout(total=timeout_s),
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
