"""What one serving pod runs, decided purely: instances, their cores, TorchServe's settings.

Everything here is dict in, dict (or text) out, so the rules are unit-tested without
TorchServe: how a plan becomes named instances with disjoint core sets, the worker-side
settings file the pinning handler reads, the ``config.properties`` that keeps every
TorchServe address on loopback and isolates its temp files, and each instance's
registration parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from packrat.plan.optimizer import Plan, PlanError
from packrat.runtime.documents import DocumentError, loads_json

LOOPBACK = "127.0.0.1"


class ServeConfigError(ValueError):
    """The plan, the cores or the options do not make a servable configuration."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One thin instance: a TorchServe model registration with one pinned worker."""

    index: int
    """Its place among the plan's instances (``plan.expand()`` order), from 0."""
    name: str
    """Its registration name (:func:`instance_name`): ``<model>_i<index>``, or
    ``<model>_g<generation>_i<index>`` for a plan switched in the pod, beside the old one's."""
    threads: int
    """Its worker's threads, one per core of :attr:`cpus`."""
    batch: int
    """The batch size the plan chose for it: the most requests its worker runs at once."""
    cpus: tuple[int, ...]
    """The CPU ids its worker is pinned to, disjoint from every other instance's."""
    engine: str = "eager"
    """What the worker runs (packrat.runtime.engines; native runtime only)."""

    def to_dict(self) -> dict[str, Any]:
        """Every field (the cpus as a list), the engine only where it is not eager."""
        out = {**asdict(self), "cpus": list(self.cpus)}
        if self.engine == "eager":
            del out["engine"]
        return out


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One instance's worker as its runtime reports it: ``READY`` (loaded, answering) or
    another status (``LOADING``, ``DEAD``, ...), and its process id when it has one."""

    status: str
    pid: int | None

    @property
    def ready(self) -> bool:
        return self.status == "READY"


RUNTIMES = ("native", "torchserve")  # packrat serve --runtime, spec.runtime
DEFAULT_RUNTIME = "native"


@dataclass(frozen=True, slots=True)
class Ports:
    """TorchServe's loopback ports."""

    inference: int
    """The inference API (predictions, ``/ping``): the block's base port."""
    management: int
    """The management API (model registration and scaling): base + 1."""
    metrics: int
    """TorchServe's own Prometheus metrics: base + 2."""
    grpc_inference: int
    """The gRPC inference API: base + 3."""
    grpc_management: int
    """The gRPC management API: base + 4."""
    worker_base: int
    """TorchServe's ``initial_worker_port`` (base + 20): it names the workers' sockets, which
    are Unix sockets in its own tmpdir, so nothing binds it (it is not in :attr:`listening`)."""

    @property
    def listening(self) -> tuple[int, ...]:
        """The ports TorchServe binds (worker sockets are Unix sockets in its own tmpdir)."""
        return (
            self.inference,
            self.management,
            self.metrics,
            self.grpc_inference,
            self.grpc_management,
        )


# TorchServe's fixed ports inside a serving pod (its own network namespace), all on
# loopback and below Linux's ephemeral range (32768-60999), so no outgoing connection can
# take one between choosing and binding. Several TorchServes on one host (tests,
# benchmarks, a laptop) use the next free block: base + PORT_BLOCK * k.
DEFAULT_PORT_BASE = 9080
PORT_BLOCK = 10
WORKER_PORT_OFFSET = 20  # initial_worker_port = base + 20 (names worker sockets)


def fixed_ports(base: int = DEFAULT_PORT_BASE) -> Ports:
    """The documented TorchServe ports of one block: inference ``base``, management
    ``base+1``, metrics ``base+2``, gRPC ``base+3`` and ``base+4``."""
    if not 1024 <= base <= 32768 - PORT_BLOCK - WORKER_PORT_OFFSET:
        raise ServeConfigError(f"TorchServe port base {base} must be in 1024..32738")
    return Ports(
        inference=base,
        management=base + 1,
        metrics=base + 2,
        grpc_inference=base + 3,
        grpc_management=base + 4,
        worker_base=base + WORKER_PORT_OFFSET,
    )


def parse_plan(text: str, *, origin: str) -> Plan:
    """A plan from the JSON ``packrat plan --format json`` prints; errors name ``origin``."""
    try:
        data = loads_json(text, invalid="plan is not valid JSON")
    except DocumentError as exc:
        raise ServeConfigError(f"{origin}: {exc}") from None
    try:
        return Plan.from_dict(data)
    except PlanError as exc:
        raise ServeConfigError(f"{origin}: {exc}") from None


def instance_name(model: str, index: int, generation: int = 0) -> str:
    """The TorchServe registration name of instance ``index`` of ``model``; a plan switched
    in the pod (generation 1, 2, ...) registers beside the old one under new names."""
    return f"{model}_g{generation}_i{index}" if generation else f"{model}_i{index}"


def plan_instances(
    plan: Plan, *, model: str, cores: Sequence[Sequence[int]], generation: int = 0
) -> list[InstanceSpec]:
    """One spec per instance of ``plan.expand()``, paired with ``cores`` (same order)."""
    pairs = plan.expand()
    if len(cores) != len(pairs):
        raise ServeConfigError(f"{len(pairs)} instances but {len(cores)} core sets")
    specs = []
    for i, ((threads, batch), cpus) in enumerate(zip(pairs, cores, strict=True)):
        if len(cpus) != threads:
            raise ServeConfigError(f"instance {i} has {threads} threads but {len(cpus)} cpus")
        specs.append(
            InstanceSpec(
                index=i,
                name=instance_name(model, i, generation),
                threads=threads,
                batch=batch,
                cpus=tuple(cpus),
                engine=plan.engine,
            )
        )
    return specs


def check_fits(plan: Plan, *, cpus: Sequence[int]) -> None:
    """A clear error when the plan needs more cores than this process may use."""
    if plan.total_threads > len(cpus):
        raise ServeConfigError(
            f"plan {plan.label} needs {plan.total_threads} cpus but this process may use "
            f"{len(cpus)} ({','.join(map(str, cpus)) or 'none'}); run it in a cpuset with "
            f"at least {plan.total_threads} cpus or choose a plan for {len(cpus)}"
        )


def worker_settings(instances: Sequence[InstanceSpec], *, pin: bool = True) -> dict[str, Any]:
    """The file the pinning handler reads (``PACKRAT_SERVE_CONFIG``), keyed by model name."""
    if not pin:
        return {"instances": {}}
    return {
        "instances": {
            inst.name: {"cpus": list(inst.cpus), "threads": inst.threads, "batch": inst.batch}
            for inst in instances
        }
    }


def render_properties(settings: Mapping[str, Any]) -> str:
    """``key=value`` lines, in the given order."""
    lines = []
    for key, value in settings.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


# TorchServe's frontend is a thin HTTP queue in front of the workers; its start is on the
# pod's path to ready, on the same cores as the zygote's imports. The client compiler alone
# (no C2) and the serial collector cut the JVM's start from about 1.45 to 0.87 s of CPU and
# a 2-instance ResNet-50 pod's start by about 0.2 s; once warm, the frontend then spends
# about 140 us more CPU per request (708 vs 569 us on the tiny model: 2% fewer requests a
# second, 0.1% of a ResNet-50 inference). Measured side by side, docs/measurements.md
# ("JVM flags"); ``packrat serve --jvm-args`` chooses others.
JVM_ARGS = (
    "-XX:+UseContainerSupport",
    "-XX:-UsePerfData",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
)


def torchserve_settings(
    *,
    ports: Ports,
    model_store: str,
    tmpdir: str,
    job_queue_size: int = 1000,
    default_workers: int | None = 1,
    response_timeout_s: int = 300,
    jvm_args: Sequence[str] = JVM_ARGS,
) -> dict[str, Any]:
    """TorchServe's ``config.properties`` as a dict: loopback only, own temp dir and ports.

    ``default_workers=None`` leaves TorchServe's default (one worker per core), for the
    out-of-the-box baseline.
    """
    settings: dict[str, Any] = {
        "inference_address": f"http://{LOOPBACK}:{ports.inference}",
        "management_address": f"http://{LOOPBACK}:{ports.management}",
        "metrics_address": f"http://{LOOPBACK}:{ports.metrics}",
        "grpc_inference_address": LOOPBACK,
        "grpc_management_address": LOOPBACK,
        "grpc_inference_port": ports.grpc_inference,
        "grpc_management_port": ports.grpc_management,
        "initial_worker_port": ports.worker_base,
        "model_store": model_store,
        "vmargs": " ".join([f"-Djava.io.tmpdir={tmpdir}", *jvm_args]),
        "disable_token_authorization": True,
        "enable_model_api": True,
        "install_py_dep_per_model": False,
        "job_queue_size": job_queue_size,
        "default_response_timeout": response_timeout_s,
        "disable_system_metrics": True,
        "async_logging": True,
    }
    if default_workers is not None:
        settings["default_workers_per_model"] = default_workers
    return settings


def registration_query(
    inst: InstanceSpec | None,
    *,
    mar: str,
    name: str | None = None,
    max_batch_delay_ms: int,
    batch: int | None = None,
    workers: int | None = 1,
    response_timeout_s: int = 300,
) -> dict[str, str]:
    """Query parameters of ``POST /models`` registering one instance (or a plain model)."""
    query = {
        "url": mar,
        "model_name": inst.name if inst else (name or ""),
        "batch_size": str(inst.batch if inst else (batch or 1)),
        "max_batch_delay": str(max_batch_delay_ms),
        "response_timeout": str(response_timeout_s),
        "synchronous": "true",
    }
    if workers is not None:
        query["initial_workers"] = str(workers)
    if not query["model_name"]:
        raise ServeConfigError("a registration needs a model name")
    return query


def status_document(
    *,
    plan: Plan,
    model: str,
    instances: Sequence[InstanceSpec],
    cpus: Sequence[int],
    estimate: int,
    ewma: float,
    ready: bool,
    health: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON that ``GET /status`` answers."""
    return {
        "model": model,
        "ready": ready,
        "cpus": list(cpus),
        "plan": plan.to_dict(),
        "instances": [{**inst.to_dict(), **dict(health.get(inst.name, {}))} for inst in instances],
        "batch_size_estimate": {"estimate": estimate, "ewma": ewma},
    }
