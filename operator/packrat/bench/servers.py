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
from pathlib import Path

from packrat.plan.optimizer import Plan
from packrat.serve.config import registration_query
from packrat.serve.pod.server import wait_ready
from packrat.serve.torchserve.archive import build_archive, default_model_name
from packrat.serve.torchserve.process import TorchServe, free_ports


class BenchError(RuntimeError):
    """The benchmark cannot run (no profile, a server that does not start)."""


class PackratServe:
    """``packrat serve`` as a subprocess on the given cpus."""

    def __init__(
        self,
        *,
        model: str,
        plan: Plan,
        cpus: Sequence[int],
        workdir: Path,
        max_batch_delay_ms: int,
        startup_timeout_s: float,
        runtime: str | None = None,
        artefacts: Path | None = None,
    ) -> None:
        self.spec, self.plan, self.cpus, self.workdir = model, plan, cpus, workdir
        self.runtime = runtime  # packrat serve --runtime (None: its default)
        self.artefacts = artefacts  # packrat serve --artefacts (a plan on another engine)
        self.max_batch_delay_ms, self.startup_timeout_s = max_batch_delay_ms, startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = default_model_name(model)

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        plan_file = self.workdir / "plan.json"
        plan_file.write_text(json.dumps(self.plan.to_dict()))
        cmd = [
            sys.executable,
            "-m",
            "packrat",
            "serve",
            "--model",
            self.spec,
            "--plan",
            str(plan_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-batch-delay-ms",
            str(self.max_batch_delay_ms),
            "--cpus",
            ",".join(map(str, self.cpus)),
            "--workdir",
            str(self.workdir / "serve"),
            "--drain-seconds",
            "10",
            *(["--runtime", self.runtime] if self.runtime else []),
            *(["--artefacts", str(self.artefacts)] if self.artefacts else []),
        ]
        log_file = (self.workdir / "serve.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        if not await wait_ready(self.url, timeout_s=self.startup_timeout_s):
            await self.stop()
            tail = (self.workdir / "serve.log").read_text(errors="replace")[-2000:]
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

    def __init__(
        self,
        *,
        model: str,
        batch: int,
        cpus: Sequence[int],
        workdir: Path,
        max_batch_delay_ms: int,
        startup_timeout_s: float,
    ) -> None:
        self.spec, self.batch, self.cpus, self.workdir = model, batch, cpus, workdir
        self.max_batch_delay_ms, self.startup_timeout_s = max_batch_delay_ms, startup_timeout_s
        self.ts: TorchServe | None = None
        self.model = default_model_name(model)
        self.url = ""

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        archive = await asyncio.to_thread(
            build_archive, self.spec, workdir=self.workdir / "archive", name=self.model
        )
        # No PACKRAT_SERVE_CONFIG: the handler finds no instance settings and does not pin.
        env = {k: "" for k in ("PACKRAT_SERVE_CONFIG",)}
        # The same cores as the other configurations, and TorchServe's default worker count.
        self.ts = TorchServe(
            workdir=self.workdir / "ts", env=env, default_workers=None, affinity=self.cpus
        )
        await self.ts.start(timeout_s=self.startup_timeout_s)
        mar = self.ts.add_archive(archive.path)
        await self.ts.register(
            registration_query(
                None,
                mar=mar,
                name=self.model,
                batch=self.batch,
                max_batch_delay_ms=self.max_batch_delay_ms,
                # TorchServe's default worker count: one per available processor (the JVM
                # sees the affinity set above). POST /models alone would start none.
                workers=len(self.cpus),
            )
        )
        self.url = self.ts.inference_url

    async def stop(self) -> None:
        if self.ts is not None:
            await self.ts.stop()
            self.ts = None
