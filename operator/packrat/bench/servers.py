"""What ``packrat bench --serving`` measures: ``packrat serve`` as a subprocess on given
cpus, or TorchServe out of the box. Each is started, measured and stopped by the benchmark.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packrat.plan.optimizer import Plan
from packrat.serve.config import registration_query
from packrat.serve.pod.server import wait_ready
from packrat.serve.torchserve.archive import build_archive, default_model_name
from packrat.serve.torchserve.process import TorchServe, free_ports


class BenchError(RuntimeError):
    """The benchmark cannot run (no profile, a server that does not start)."""


@dataclass(frozen=True)
class Launch:
    """What a benchmarked server starts with, whatever it serves (the same for every
    configuration that one measurement compares)."""

    model: str
    """The model served: a zoo name or model file (``packrat serve --model``)."""
    cpus: Sequence[int]
    """The cores the server runs on."""
    workdir: Path
    """A folder of its own: its plan or model archive, its logs."""
    max_batch_delay_ms: int
    """How long a batch may wait to fill, ms (TorchServe's ``maxBatchDelay``)."""
    startup_timeout_s: float
    """How long the server may take to answer ready, s."""


class PackratServe:
    """``packrat serve`` as a subprocess on the given cpus."""

    def __init__(
        self,
        launch: Launch,
        *,
        plan: Plan,
        runtime: str | None = None,
        artefacts: Path | None = None,
    ) -> None:
        self.launch, self.plan = launch, plan
        self.runtime = runtime  # packrat serve --runtime (None: its default)
        self.artefacts = artefacts  # packrat serve --artefacts (a plan on another engine)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = default_model_name(launch.model)

    async def start(self) -> None:
        launch = self.launch
        launch.workdir.mkdir(parents=True, exist_ok=True)
        plan_file = launch.workdir / "plan.json"
        plan_file.write_text(json.dumps(self.plan.to_dict()))
        cmd = [
            sys.executable,
            "-m",
            "packrat",
            "serve",
            "--model",
            launch.model,
            "--plan",
            str(plan_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-batch-delay-ms",
            str(launch.max_batch_delay_ms),
            "--cpus",
            ",".join(map(str, launch.cpus)),
            "--workdir",
            str(launch.workdir / "serve"),
            "--drain-seconds",
            "10",
            *(["--runtime", self.runtime] if self.runtime else []),
            *(["--artefacts", str(self.artefacts)] if self.artefacts else []),
        ]
        log_file = (launch.workdir / "serve.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        if not await wait_ready(self.url, timeout_s=launch.startup_timeout_s):
            await self.stop()
            tail = (launch.workdir / "serve.log").read_text(errors="replace")[-2000:]
            raise BenchError(f"packrat serve ({self.plan.label}) did not become ready:\n{tail}")

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        for _ in range(300):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self.proc = None


class PlainTorchServe:
    """TorchServe out of the box: default workers, no thread settings, no pinning."""

    def __init__(self, launch: Launch, *, batch: int) -> None:
        self.launch, self.batch = launch, batch
        self.ts: TorchServe | None = None
        self.model = default_model_name(launch.model)
        self.url = ""

    async def start(self) -> None:
        launch = self.launch
        launch.workdir.mkdir(parents=True, exist_ok=True)
        archive = await asyncio.to_thread(
            build_archive, launch.model, workdir=launch.workdir / "archive", name=self.model
        )
        # No PACKRAT_SERVE_CONFIG: the handler finds no instance settings and does not pin.
        env = {k: "" for k in ("PACKRAT_SERVE_CONFIG",)}
        # The same cores as the other configurations, and TorchServe's default worker count.
        self.ts = TorchServe(
            workdir=launch.workdir / "ts", env=env, default_workers=None, affinity=launch.cpus
        )
        await self.ts.start(timeout_s=launch.startup_timeout_s)
        mar = self.ts.add_archive(archive.path)
        await self.ts.register(
            registration_query(
                None,
                mar=mar,
                name=self.model,
                batch=self.batch,
                max_batch_delay_ms=launch.max_batch_delay_ms,
                # TorchServe's default worker count: one per available processor (the JVM
                # sees the affinity set above). POST /models alone would start none.
                workers=len(launch.cpus),
            )
        )
        self.url = self.ts.inference_url

    async def stop(self) -> None:
        if self.ts is not None:
            await self.ts.stop()
            self.ts = None
