"""The pod's side of the zygote: start it, write the "python" TorchServe runs, stop it.

:class:`ZygoteProcess` starts ``python -m packrat.serve.zygote`` (it imports torch and maps
the weights while TorchServe's JVM starts) and writes a two-line shell script that
TorchServe is given as its workers' interpreter: it runs
:mod:`packrat.serve.worker_launcher` without site-packages, which asks the zygote for a
forked worker (or runs the real interpreter when the zygote cannot be reached).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
from pathlib import Path

from packrat.serve import worker_launcher

SUBDIR = "zygote"


class ZygoteProcess:
    """One zygote for one pod."""

    def __init__(self, workdir: Path, *, model: str, weights: Path | None) -> None:
        self.dir = workdir / SUBDIR
        self.socket = self.dir / "zygote.sock"
        self.python = self.dir / "python"
        self.model = model
        self.weights = weights
        self.proc: asyncio.subprocess.Process | None = None

    def write_launcher(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        real = shlex.quote(sys.executable)
        script = shlex.quote(str(Path(worker_launcher.__file__).resolve()))
        sock = shlex.quote(str(self.socket))
        self.python.write_text(f'#!/bin/sh\nexec {real} -S -E {script} {real} {sock} "$@"\n')
        self.python.chmod(0o700)
        return self.python

    async def start(self) -> Path:
        """Start the zygote; returns the interpreter path to hand to TorchServe."""
        path = self.write_launcher()
        args = [sys.executable, "-m", "packrat.serve.zygote", str(self.socket)]
        if self.weights is not None:
            args += ["--model", self.model, "--weights", str(self.weights)]
        log = (self.dir / "zygote.log").open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its workers never share the pod's process group
            )
        finally:
            log.close()
        return path

    async def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
