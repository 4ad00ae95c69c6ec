"""One serving pod, end to end: cpuset -> core sets -> runtime instances -> dispatcher.

``packrat serve`` calls :func:`serve`. Order matters for readiness: the dispatcher listens
first (so ``/ping`` answers "not ready" while models load), then the runtime backend starts
(:mod:`packrat.serve.pod.runtime`: native workers forked from the zygote, or TorchServe on
loopback), every instance is added (one pinned worker each, its batch size, the max batch
delay), warmed with one batch, and only then marked up. A monitor
(:mod:`packrat.serve.pod.health`) keeps asking the runtime for each worker's state: an
instance whose worker is not READY is marked down, and a worker with a new pid (the runtime
restarted it) is warmed again before it is marked up, so ``/ping`` reflects worker restarts
(a native worker's death marks its instance down at once). The monitor also pings
TorchServe's frontend (short timeout; the native runtime has none) and reads each worker's
state from ``/proc`` (a stopped, SIGSTOPped, or zombie worker is down), so readiness fails
within a few seconds of either one no longer answering. When TorchServe itself is gone,
every queued request is answered 503 at once and the pod exits with status 1 within
seconds, so Kubernetes restarts it. SIGTERM or SIGINT: stop listening, finish what is in
flight (at most ``drain_seconds``; after an optional ``drain_grace_seconds`` during which it
still accepts connections but reports not ready), stop the runtime, return 0.

``/status`` reports the plan, the estimates, the queue and each instance's health; never
process ids or internal addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from packrat.plan.estimator import SERVING_ROUNDING
from packrat.plan.optimizer import Plan
from packrat.serve.auth import AdminToken
from packrat.serve.config import (
    DEFAULT_RUNTIME,
    JVM_ARGS,
    RUNTIMES,
    InstanceSpec,
    ServeConfigError,
    check_fits,
    plan_instances,
    status_document,
    worker_settings,
)
from packrat.serve.dispatcher.app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES,
    Dispatcher,
)
from packrat.serve.dispatcher.connections import ConnectionLimits
from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogger
from packrat.serve.dispatcher.slots import STUCK_AFTER_S
from packrat.serve.native.runtime import NativeRuntime
from packrat.serve.pod.health import (
    Health,
    TorchServeGoneError,
    check_instances,
    monitor,
    process_runnable,
    warm,
)
from packrat.serve.pod.inpod import InPodSwitch, admin_routes
from packrat.serve.pod.memory import container_memory_limit
from packrat.serve.pod.runtime import RuntimeBackend, make_runtime
from packrat.serve.pod.timeline import StartTimeline, process_start
from packrat.serve.torchserve.archive import default_model_name
from packrat.serve.zygote.process import ZygoteProcess, ZygoteStartError
from packrat.serve.zygote.shared_weights import ensure_weights, shared_weights_file

if TYPE_CHECKING:  # grpcio is an optional extra: imported when a gRPC port is asked for
    from packrat.serve.dispatcher.oip.grpc_server import GrpcFront

__all__ = [
    "PodServer",
    "ServeOptions",
    "TorchServeGoneError",
    "process_runnable",
    "resolve_cores",
    "sample_body",
    "serve",
    "wait_ready",
]

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """Everything ``packrat serve`` is told."""

    model: str
    plan: Plan
    model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    grpc_port: int | None = None  # the Open Inference Protocol over gRPC (None: off)
    max_batch_delay_ms: int = 5
    queue_limit: int = 1024
    drain_seconds: float = 30.0
    drain_grace_seconds: float = 0.0  # keep accepting (not ready) this long after SIGTERM
    workdir: Path | None = None
    cpus: Sequence[int] | None = None  # default: this process's cpuset
    warmup_body: bytes | None = None  # for a .mar; zoo/TorchScript models build their own
    health_interval_s: float = 0.5
    health_timeout_s: float = 2.0  # a frontend ping slower than this marks every instance down
    # an instance down this long after it served (a crash-looping worker) fails liveness
    stuck_instance_s: float = 180.0
    estimator_interval_s: float = 0.005
    estimator_rounding: str = SERVING_ROUNDING  # or "floor" (packrat.plan.estimator)
    shared_weights: bool = True  # one mapped copy per pod (False: each instance its own)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    body_timeout_s: float = 30.0
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    torchserve_port_base: int | None = None  # default 9080, or $PACKRAT_TORCHSERVE_PORT_BASE
    # enables POST /admin/plan (the in-pod switch): a token, or a TokenFile read as it changes
    admin_token: AdminToken = None
    zygote: bool = (
        True  # workers forked from one process that imported torch (packrat.serve.zygote.zygote)
    )
    jvm_args: tuple[str, ...] = JVM_ARGS  # TorchServe's JVM flags
    runtime: str = DEFAULT_RUNTIME  # "native" or "torchserve" (packrat.serve.pod.runtime)
    zygote_process: ZygoteProcess | None = None  # already started for this workdir (prestart)
    owns_workdir: bool = False  # remove ``workdir`` after a clean exit (the caller made it)
    payload_log: PayloadLogConfig | None = None  # request and response logging (off: None)


def resolve_cores(plan: Plan, cpus: Sequence[int] | None) -> tuple[list[int], list[list[int]]]:
    """This process's cpus and one disjoint core set per plan instance (or a clear error)."""
    from packrat.runtime.cpus import CoreAssignmentError, allowed_cpus, assign_cores

    available = sorted(cpus) if cpus is not None else allowed_cpus()
    check_fits(plan, cpus=available)
    try:
        cores = assign_cores([t for t, _ in plan.expand()], cpus=available)
    except CoreAssignmentError as exc:
        raise ServeConfigError(str(exc)) from None
    return available, cores


def check_grpc_port(grpc_port: int, port: int) -> None:
    """A usable gRPC port, and grpcio installed (the ``grpc`` extra), or one clear error."""
    if not 0 <= grpc_port < 65536 or grpc_port == port:
        raise ServeConfigError(f"--grpc-port must be in 0..65535 and not --port, got {grpc_port}")
    try:
        import grpc  # noqa: F401
    except ImportError:
        raise ServeConfigError(
            "--grpc-port needs grpcio: pip install 'packrat-operator[grpc]'"
        ) from None


def sample_body(inputs: list[dict[str, Any]] | None, spec: str) -> bytes | None:
    """One request body for warm-up, raw bytes, made without torch where it can be."""
    if inputs is None:
        return None
    from packrat.serve.codec import example_body, warmup_body

    body = warmup_body(inputs)
    return body if body is not None else example_body(spec)


class PodServer:
    """The running pod: owns the work directory, the runtime backend and the dispatcher."""

    def __init__(self, opts: ServeOptions) -> None:
        if opts.runtime not in RUNTIMES:
            known = ", ".join(RUNTIMES)
            raise ServeConfigError(f"unknown runtime {opts.runtime!r}: one of {known}")
        self.opts = opts
        self.grpc: GrpcFront | None = None
        if opts.grpc_port is not None:
            check_grpc_port(opts.grpc_port, opts.port)
        self.name = opts.model_name or default_model_name(opts.model)
        self.cpus, cores = resolve_cores(opts.plan, opts.cpus)
        self.instances: list[InstanceSpec] = plan_instances(opts.plan, model=self.name, cores=cores)
        self._own_workdir = opts.workdir is None or opts.owns_workdir
        self.workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="packrat-serve-"))
        self.health = {inst.name: Health() for inst in self.instances}
        self.metrics = ServeMetrics()
        self.runtime: RuntimeBackend | None = None
        self.dispatcher: Dispatcher | None = None
        self.warmup: bytes | None = opts.warmup_body
        self.port: int | None = None
        given = opts.zygote_process if opts.zygote else None
        if given is not None and (
            given.workdir != self.workdir
            or given.model != opts.model
            or given.runtime != opts.runtime
        ):
            raise ServeConfigError(
                "the prestarted zygote is for another work directory, model or runtime"
            )
        self.weights = (  # a model file is hashed once: by whoever names the weight file first
            given.weights
            if given is not None
            else shared_weights_file(opts.model, self.workdir, enabled=opts.shared_weights)
        )
        self.generation = 0  # bumped by each in-pod plan switch
        self.memory_limit = container_memory_limit()  # the watchdog's (pod.memory)
        self.lock = asyncio.Lock()  # held while the instances are checked or swapped
        self.switcher = InPodSwitch(self)
        self.zygote = (
            given
            or ZygoteProcess(
                self.workdir,
                model=opts.model,
                weights=self.weights,
                runtime=opts.runtime,
            )
            if opts.zygote
            else None
        )
        self._stop = asyncio.Event()
        self.timeline = StartTimeline(origin=process_start())
        self._warmed: dict[str, float] = {}  # instance -> when its last warm-up ended

    def status(self) -> dict[str, Any]:
        d = self.dispatcher
        doc = status_document(
            plan=self.opts.plan,
            model=self.name,
            instances=self.instances,
            cpus=self.cpus,
            estimate=d.estimator.estimate if d else 1,
            ewma=d.estimator.ewma if d else 0.0,
            ready=bool(d and d.ready),
            health={k: v.to_dict() for k, v in self.health.items()},
        )
        return doc

    def write_settings(self, instances: Sequence[InstanceSpec]) -> None:
        """The workers' settings file (cores per instance, the weight file), atomically."""
        doc = worker_settings(instances)
        if self.weights is not None:
            doc["weights"] = str(self.weights)
        path = self.workdir / "packrat-workers.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)

    def adopt(
        self, plan: Plan, instances: Sequence[InstanceSpec], pids: Sequence[int], *, generation: int
    ) -> None:
        """After an in-pod switch: ``instances`` (warmed, workers ``pids``) serve ``plan``."""
        self.opts.plan = plan
        self.instances = list(instances)
        self.generation = generation
        self.show_engine(plan.engine)
        self.health = {
            inst.name: Health(up=True, pid=pid, warmed_pid=pid, status="READY")
            for inst, pid in zip(instances, pids, strict=True)
        }

    def show_engine(self, engine: str) -> None:
        """``packrat_plan_engine``: 1 for the running plan's engine, 0 for the others seen."""
        gauge = self.metrics.plan_engine
        for sample in [s for metric in gauge.collect() for s in metric.samples]:
            if sample.labels.get("model") == self.name and sample.labels.get("engine") != engine:
                gauge.labels(self.name, sample.labels["engine"]).set(0)
        gauge.labels(self.name, engine).set(1)

    def _alive(self) -> bool:
        """Liveness: the runtime runs, and no instance has been down for ``stuck_instance_s``
        since it last served (its worker crash-loops: only a new pod can mend it)."""
        if self.runtime is None:
            return True  # not started yet counts as alive
        if not self.runtime.running:
            return False
        now = asyncio.get_running_loop().time()
        limit = self.opts.stuck_instance_s
        stuck = [
            n
            for n, h in self.health.items()
            if h.down_since is not None and now - h.down_since > limit
        ]
        if stuck:
            log.warning("instances down for over %.0f s: %s", limit, ", ".join(stuck))
        return not stuck

    def _worker_died(self, name: str) -> None:
        """A native worker died: its instance is down now (the monitor brings it back up once
        the restarted worker is warm), so no request goes to it meanwhile."""
        for i, inst in enumerate(self.instances):
            if inst.name == name and self.dispatcher is not None:
                self.health[name].up = False
                self.health[name].status = "DEAD"
                self.dispatcher.set_up(i, False)

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        opts = self.opts
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.runtime = runtime = self._make_runtime()
        self.dispatcher = dispatcher = self._make_dispatcher(runtime)
        runner = dispatcher.runner(opts.limits, handle_signals=False)
        site = await self._listen(runner)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        monitors: list[asyncio.Task[None]] = []  # the monitor, once started
        stop_wait = asyncio.create_task(self._stop.wait())
        code = 0
        try:
            if not await self._serve_until_stopped(stop_wait, monitors):
                code = 1
                return code  # no drain: nothing can be served any more
            stop_wait.cancel()
            await self._drain(site)
        except Exception:
            code = 1
            raise
        finally:
            stop_wait.cancel()
            await self._shut_down(runner, runtime, monitors, code=code)
        log.info("packrat serve: stopped")
        return code

    def _make_runtime(self) -> RuntimeBackend:
        """The runtime that runs the plan's instances, on the worker settings written now."""
        opts = self.opts
        settings = self.workdir / "packrat-workers.json"
        self.write_settings(self.instances)
        runtime = make_runtime(
            opts.runtime,
            workdir=self.workdir,
            settings=settings,
            max_batch_delay_ms=opts.max_batch_delay_ms,
            weights=self.weights,
            zygote=self.zygote,
            port_base=opts.torchserve_port_base,
            jvm_args=opts.jvm_args,
        )
        if isinstance(runtime, NativeRuntime):
            runtime.on_death = self._worker_died
        return runtime

    def _make_dispatcher(self, runtime: RuntimeBackend) -> Dispatcher:
        opts = self.opts
        dispatcher = Dispatcher(
            model=self.name,
            instances=self.instances,
            backend=runtime,
            queue_limit=opts.queue_limit,
            metrics=self.metrics,
            status=self.status,
            estimator_interval_s=opts.estimator_interval_s,
            estimator_rounding=opts.estimator_rounding,
            alive=self._alive,
            max_body_bytes=opts.max_body_bytes,
            max_buffered_bytes=opts.max_buffered_bytes,
            body_timeout_s=opts.body_timeout_s,
            routes=admin_routes(self.switcher, opts.admin_token),
            admin_token=opts.admin_token,  # POST /admin/canary
            # a batch many times slower than planned is a hung handler, not a slow batch
            stuck_after_s=max(STUCK_AFTER_S, 20 * opts.plan.expected_latency_ms / 1000.0),
            payload_log=(
                PayloadLogger(opts.payload_log, model=self.name, registry=self.metrics.registry)
                if opts.payload_log is not None
                else None
            ),
        )
        if isinstance(runtime, NativeRuntime):  # it reports each batch: full or timed out
            runtime.on_batch = lambda name, full: dispatcher.record_batch(name, full=full)
        return dispatcher

    async def _listen(self, runner: web.AppRunner) -> web.TCPSite:
        """Open the public port (the instances are not loaded yet: not ready)."""
        opts = self.opts
        await runner.setup()
        site = web.TCPSite(runner, opts.host, opts.port, shutdown_timeout=opts.drain_seconds)
        await site.start()
        addresses = runner.addresses
        self.port = int(addresses[0][1]) if addresses else opts.port
        self.timeline.mark("dispatcher_listening")
        log.info(
            "packrat serve: %s plan %s on cpus %s (%s runtime), listening on http://%s:%d",
            self.name,
            opts.plan.label,
            ",".join(map(str, self.cpus)),
            opts.runtime,
            opts.host,
            self.port,
        )
        return site

    async def _serve_until_stopped(
        self, stop_wait: asyncio.Task[Any], monitors: list[asyncio.Task[None]]
    ) -> bool:
        """Start the instances, then watch them until a stop is requested; False when the
        runtime is gone (nothing left to drain). A startup error is raised."""
        starting = asyncio.create_task(self._start_backend())
        done, _ = await asyncio.wait({starting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if starting not in done:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            return True
        starting.result()  # raises a startup error
        log.info("packrat serve: every instance is loaded and warmed; ready")
        monitor = asyncio.create_task(self._monitor())
        monitors.append(monitor)
        done, _ = await asyncio.wait({monitor, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if monitor in done:
            try:
                monitor.result()
            except TorchServeGoneError as exc:  # the runtime is gone
                log.error("packrat serve: %s", exc)
                return False
        return True

    async def _drain(self, site: web.TCPSite) -> None:
        """Report not ready, close the port (after the grace), wait for what is in flight."""
        opts, dispatcher = self.opts, self.dispatcher
        assert dispatcher is not None
        log.info("packrat serve: draining (%d outstanding)", dispatcher.pending)
        dispatcher.begin_drain()
        if opts.drain_grace_seconds > 0:
            # Endpoints and load balancers notice a terminating pod late: keep serving,
            # reporting not-ready, until they have stopped sending new connections.
            await asyncio.sleep(opts.drain_grace_seconds)
        if self.grpc is not None:  # new calls refused, those in flight finish
            await asyncio.gather(site.stop(), self.grpc.stop(opts.drain_seconds))
        else:
            await site.stop()
        if not await dispatcher.wait_idle(opts.drain_seconds):
            log.warning(
                "packrat serve: %d requests still outstanding after the drain",
                dispatcher.pending,
            )

    async def _shut_down(
        self,
        runner: web.AppRunner,
        runtime: RuntimeBackend,
        monitors: list[asyncio.Task[None]],
        *,
        code: int,
    ) -> None:
        """Stop everything run started, in reverse; the private workdir goes after a clean
        stop."""
        await self.switcher.close()
        if self.grpc is not None:
            await self.grpc.stop(None)
        for task in monitors:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await runner.cleanup()
        await runtime.stop()
        if self.zygote is not None:
            await self.zygote.stop()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        if self._own_workdir and code == 0:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _start_backend(self) -> None:
        runtime = self.runtime
        assert runtime is not None

        async def prepare() -> None:
            inputs = await runtime.load_model(self.opts.model, self.name)
            assert self.dispatcher is not None
            self.dispatcher.inputs = inputs  # what the v2 protocol's metadata and infer use
            if inputs:  # one sample's worth of JSON, not 6 MiB (issue 26)
                from packrat.serve.codec import input_body_cap

                cap = input_body_cap(inputs, self.opts.max_body_bytes)
                self.dispatcher.max_body_bytes = cap
                log.info("packrat serve: request bodies capped at %d bytes for this model", cap)
            if self.warmup is None:
                self.warmup = await asyncio.to_thread(sample_body, inputs, self.opts.model)
            if self.zygote is None and self.weights is not None:
                await ensure_weights(self.opts.model, self.weights)  # the zygote writes its own

        # The model is prepared while the runtime starts (TorchServe's JVM).
        await asyncio.gather(prepare(), runtime.start())
        log.info("packrat serve: the %s runtime is up and the model is prepared", runtime.kind)
        await self._start_grpc()
        # Instances start while the zygote may still be preparing: TorchServe's launchers and
        # the native runtime wait for it. A zygote that fails ends the start (and the
        # instances waiting on it) with its own error.
        try:
            async with asyncio.TaskGroup() as group:
                if self.zygote is not None:
                    group.create_task(self._zygote_ready())
                for inst in self.instances:
                    group.create_task(runtime.add(inst))
        except ExceptionGroup as failed:  # the first failure, as a plain error for the CLI
            raise failed.exceptions[0] from None
        async with self.lock:
            await self._check_instances(initial=True)
        self._log_timeline()
        if self.zygote is not None:  # the native zygote kept its weight file for now
            try:
                log.info("packrat serve: weight file: %s", await self.zygote.write_weights())
            except ZygoteStartError as exc:  # only a later start needs the file
                log.warning("packrat serve: the zygote did not write the weight file: %s", exc)

    async def _start_grpc(self) -> None:
        """The gRPC port, once the model's inputs (and so its message cap) are known; until
        then gRPC clients find the port closed, as they would a server not ready."""
        port = self.opts.grpc_port
        if port is None or self.dispatcher is None:
            return
        from packrat.serve.dispatcher.oip.grpc_server import GrpcFront

        self.grpc = GrpcFront(self.dispatcher, alive=self._alive)
        bound = await self.grpc.start(self.opts.host, port)
        log.info("packrat serve: the Open Inference Protocol over gRPC on port %d", bound)

    def _log_timeline(self) -> None:
        """The start-up timeline (:mod:`packrat.serve.pod.timeline`): one log line and the
        ``packrat_startup_seconds`` gauge, per step."""
        timeline = self.timeline
        timeline.mark("ready")
        if self.zygote is not None:
            if self.zygote.started_at is not None:
                timeline.mark("zygote_spawned", self.zygote.started_at)
            steps = {"imported": "torch_imported", "built": "model_built"}
            timeline.merge(self.zygote.marks(), {**steps, "listening": "zygote_listening"})
        if isinstance(self.runtime, NativeRuntime):
            workers = [i.marks for i in self.runtime.instances.values()]
            timeline.mark_last("workers_forked", (m["began"] for m in workers if "began" in m))
            timeline.mark_last("workers_loaded", (m["loaded"] for m in workers if "loaded" in m))
        timeline.mark_last("workers_warmed", self._warmed.values())
        log.info("packrat serve: %s", timeline.line())
        for step, seconds in timeline.offsets().items():
            self.metrics.startup_seconds.labels(self.name, step).set(seconds)
        self.show_engine(self.opts.plan.engine)

    async def _zygote_ready(self) -> None:
        assert self.zygote is not None
        await self.zygote.wait_ready()
        log.info("packrat serve: the zygote is ready")

    async def _monitor(self) -> None:
        await monitor(self)

    async def _check_instances(self, *, initial: bool) -> None:
        await check_instances(self, initial=initial)

    async def warm(self, inst: InstanceSpec) -> None:
        """A warm-up batch straight to the instance (:func:`packrat.serve.pod.health.warm`)."""
        await warm(self, inst)
        self._warmed[inst.name] = time.monotonic()


async def serve(opts: ServeOptions) -> int:
    """Run one serving pod until SIGTERM/SIGINT; 0 after a clean drain."""
    server = PodServer(opts)
    return await server.run()


async def wait_ready(url: str, *, timeout_s: float, path: str = "/ping") -> bool:
    """Poll ``url`` + ``path`` until it answers 200 (for tests, benchmarks and the operator;
    a pool process answers ``/v2/health/ready``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while asyncio.get_running_loop().time() < deadline:
            try:
                async with session.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.2)
    return False
