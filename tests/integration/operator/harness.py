"""Everything an operator integration test needs: emulator, agent, the operator process, load.

``OperatorCluster`` starts the kmock emulator (with its compatibility layer), the test agent
(kubelet, controllers, kube-proxy, garbage collector) and ``packrat operator`` as a real
subprocess pointed at the emulator through a kubeconfig, so a test can kill and restart it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from agent import Agent, free_port
from emulator import Api, EmulatorThread
from jsonhttp import http_json

NAMESPACE = "packrat-test"
TEST_IMAGE = "local/packrat-serving:test"
T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    period: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds with
    ``what`` (and ``detail()``, evaluated then: the state that did not converge)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(period)


class OperatorProcess:
    def __init__(
        self,
        *,
        kubeconfig: Path,
        log: Path,
        serving_url: str,
        pod_url: str | None = None,
        inpod_switch: bool = False,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.serving_url = serving_url
        self.pod_url = pod_url
        self.inpod_switch = inpod_switch
        self.log = log
        self.metrics_port = 0
        self.liveness_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log_offset = 0  # where this start's output begins in the shared log

    def start(self) -> None:
        """Start the operator on ports fresh for this start: a port freed by the previous
        process may be taken by anything else on a busy machine between stop and start (it
        was, and the restarted operator died with ``Address already in use``)."""
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            "-m",
            "packrat",
            *(["-v"] if os.environ.get("PACKRAT_OPERATOR_VERBOSE") else []),
            "operator",
            "--namespace",
            NAMESPACE,
            # event-driven: a change wakes its model; the resync is only a safety net
            "--resync-seconds",
            "300",
            "--poll-seconds",
            "0.5",
            "--profile-retry-seconds",
            "1",
            # a storageUri model replaced in the store is noticed within seconds
            "--storage-check-seconds",
            "2",
            # the stores and servers of these tests listen on loopback, which the operator
            # refuses by default (issue 26: no fetch for a model author reaches internal ranges)
            "--egress-allow",
            "127.0.0.0/8",
            "--image",
            TEST_IMAGE,
            "--metrics-port",
            str(self.metrics_port),
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--serving-url",
            self.serving_url,
            *(["--pod-url", self.pod_url] if self.pod_url else []),
            *([] if self.inpod_switch else ["--no-inpod-switch"]),
        ]
        self.starts += 1
        with self.log.open("ab") as out:
            self._log_offset = out.tell()
            out.write(f"\n=== operator start {self.starts} ===\n".encode())
            out.flush()
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """Crash-stop (SIGKILL): nothing gets a chance to clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def wait_healthy(self, timeout: float = 180, *, port_retries: int = 3) -> None:
        """Wait until the operator answers its liveness probe (and so serves its metrics).

        A port picked free can still be taken by another process before the operator binds
        it (the window is the operator's start-up, seconds on a loaded machine): an operator
        that exits for that reason alone is started again on fresh ports, up to
        ``port_retries`` times; any other exit fails."""
        retries = port_retries

        def up() -> bool:
            nonlocal retries
            if self.proc is not None and self.proc.poll() is not None:
                if retries > 0 and self._lost_port_race():
                    retries -= 1
                    self.start()
                    return False
                raise AssertionError(f"the operator exited with {self.proc.returncode}")
            return self.healthy()

        wait_for(up, timeout=timeout, what="the operator's liveness probe", period=0.25)

    def _lost_port_race(self) -> bool:
        """This start's output says a port was taken (``Address already in use``)."""
        with self.log.open("rb") as f:
            f.seek(self._log_offset)
            return b"Address already in use" in f.read()

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False


class OperatorCluster:
    """``inpod_switch``: the operator switches a plan change that keeps the cores inside the
    running pods (its default). Off by default here: the modules written before it test the
    Deployment switch with batch changes; ``test_operator_inpod`` turns it on."""

    def __init__(self, workdir: Path, *, inpod_switch: bool = False) -> None:
        self.workdir = workdir
        self.emulator = EmulatorThread().start()
        assert self.emulator.emulator is not None
        self.api = Api(self.emulator.url, NAMESPACE)
        self.pods_dir = Path(tempfile.mkdtemp(prefix="prk-"))  # short: Unix socket paths
        self.agent = Agent(
            api=self.api,
            emulator=self.emulator.emulator,
            workdir=self.pods_dir,
            images={TEST_IMAGE},
        ).start()
        kubeconfig = self.emulator.write_kubeconfig(
            workdir / "kubeconfig.json", namespace=NAMESPACE
        )
        self.operator = OperatorProcess(
            kubeconfig=kubeconfig,
            log=workdir / "operator.log",
            # the agent's kube-proxy stands in for the Service's cluster DNS name
            serving_url=f"http://127.0.0.1:{self.agent.proxy.port}/svc/{{service}}",
            # ... and each pod's IP: the agent publishes serving pods, the proxy reaches them
            pod_url=f"http://127.0.0.1:{self.agent.proxy.port}/pod/{{pod}}",
            inpod_switch=inpod_switch,
        )
        try:
            self.operator.start()
            self.operator.wait_healthy()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.operator.stop()
        self.agent.stop()
        self.emulator.stop()
        shutil.rmtree(self.pods_dir, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------
    def model(self, name: str) -> dict[str, Any]:
        obj = self.api.get("packratmodels", name)
        assert obj is not None, f"packratmodel {name} is gone"
        return obj

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.model(name).get("status") or {}
        return status

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for cond in self.status(name).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return {}

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.api.list("events") if reason is None or e.get("reason") == reason]

    def predict(self, service: str, model: str, *, timeout: float = 10) -> tuple[int, Any]:
        """One prediction of 16 features through ``service``: see :func:`http_json`."""
        url = f"{self.agent.proxy.url(service)}/predictions/{model}"
        return http_json(url, [0.1] * 16, timeout=timeout)

    def log_tail(self, lines: int = 60) -> str:
        text = (self.workdir / "operator.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


class ClientThreads:
    """Closed-loop client threads for a ``with`` block: each calls ``_one`` (one request,
    recorded as the subclass likes) then pauses ``pause_s``, until the block ends. A
    subclass (a dataclass) declares ``clients``, ``_stop`` and ``_threads``."""

    clients: int
    _stop: threading.Event
    _threads: list[threading.Thread]
    pause_s: ClassVar[float] = 0.01
    join_s: ClassVar[float] = 30.0
    thread_name: ClassVar[str] = "load"

    def _one(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self._one()
            time.sleep(self.pause_s)

    def __enter__(self) -> Self:
        for i in range(self.clients):
            thread = threading.Thread(target=self._run, name=f"{self.thread_name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.join_s)


@dataclass
class Load(ClientThreads):
    """Steady closed-loop load through the Service proxy; records every request."""

    cluster: OperatorCluster
    service: str
    model: str
    clients: int = 2
    results: list[tuple[float, int]] = field(default_factory=list)
    failures: list[tuple[float, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self) -> None:
        code, body = self.cluster.predict(self.service, self.model)
        now = time.monotonic()
        self.results.append((now, code))
        if code != 200:
            self.failures.append((now, code, str(body)[:200]))

    def served_between(self, start: float, end: float) -> tuple[int, int]:
        window = [code for t, code in self.results if start <= t <= end]
        return sum(1 for c in window if c == 200), sum(1 for c in window if c != 200)


@dataclass
class BurstLoad:
    """Closed-loop bursts of ``burst`` concurrent requests through the Service proxy, from
    ``packrat loadgen`` subprocesses (asyncio, outside this process: the test process's GIL
    serves the emulator and the agent, not the clients), run back to back in chunks until
    stopped.

    ``records`` holds (start time on this process's monotonic clock, latency s, status code)
    for every request; ``burst`` may be changed while running (the next chunk uses it).
    """

    cluster: OperatorCluster
    service: str
    model: str
    burst: int
    chunk: int = 100
    records: list[tuple[float, float, int]] = field(default_factory=list)
    failures: list[tuple[float, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        body = self.cluster.workdir / "burst-body.json"
        body.write_text(json.dumps([0.1] * 16))
        while not self._stop.is_set():
            burst = self.burst
            cmd = [
                sys.executable,
                "-m",
                "packrat",
                "loadgen",
                "--url",
                self.cluster.agent.proxy.url(self.service),
                "--model",
                self.model,
                "--input",
                str(body),
                "--burst",
                str(burst),
                "--bursts",
                str(max(1, self.chunk // max(1, burst // 4))),
                "--timeout",
                "60",
                "--format",
                "json",
                "--records",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
            finished = time.monotonic()
            if proc.returncode != 0:
                self.errors.append(proc.stderr[-500:])
                time.sleep(0.2)
                continue
            doc = json.loads(proc.stdout)
            records = doc.get("records") or []
            # loadgen's clock starts after its imports: align its last answer with its exit
            last = max((float(r["sent_s"]) + float(r["latency_s"]) for r in records), default=0)
            for rec in records:
                at = finished - last + float(rec["sent_s"])
                code = int(rec.get("status") or 0)
                self.records.append((at, float(rec["latency_s"]), code))
                if code != 200:
                    self.failures.append((at, code))

    def __enter__(self) -> BurstLoad:
        self._thread = threading.Thread(target=self._run, name="burst-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
