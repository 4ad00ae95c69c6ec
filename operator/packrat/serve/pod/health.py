"""The serving pod's instance health: checking every instance's worker, warming a new one,
and the monitor loop that keeps ``/ping`` true to what the runtime and ``/proc`` say.

An instance is marked up only after its worker is READY, runnable, and answered a warm-up
batch; a worker with a new pid (the runtime restarted it) is warmed again before it is
marked up. A worker whose private memory threatens the container's limit is killed first
(:mod:`packrat.serve.pod.memory`: a leaking handler costs its instance, not the pod).
The monitor pings the runtime's frontend (TorchServe's, with a short timeout; the
native runtime has none) and reads each worker's state from ``/proc`` (a stopped,
SIGSTOPped, or zombie worker is down). The functions work on
a :class:`~packrat.serve.pod.server.PodServer` and run under its lock.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from packrat.serve.config import InstanceSpec
from packrat.serve.pod.memory import reclaim

if TYPE_CHECKING:
    from packrat.serve.pod.server import PodServer

__all__ = [
    "Health",
    "TorchServeGoneError",
    "check_instances",
    "monitor",
    "process_runnable",
    "warm",
]

log = logging.getLogger(__name__)


class TorchServeGoneError(RuntimeError):
    """TorchServe exited while the pod was serving."""


@dataclass
class Health:
    up: bool = False
    pid: int | None = None
    warmed_pid: int | None = None
    restarts: int = 0
    status: str = "LOADING"
    extra: dict[str, Any] = field(default_factory=dict)
    # when the instance last went down after serving (monotonic s), None while it is up: a
    # worker that crash-loops (a truncated weight file) stays down, and liveness fails
    down_since: float | None = None

    def note(self, now: float) -> None:
        """Record the instance's up/down state as of ``now`` (the monitor, every check)."""
        if self.up:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = now

    def to_dict(self) -> dict[str, Any]:
        # No pid: /status is reachable by anyone who can reach the port.
        return {"up": self.up, "restarts": self.restarts, "status": self.status}


def process_runnable(pid: int) -> bool:
    """False when the process is gone, stopped (SIGSTOP: ``T``, traced: ``t``) or a zombie
    (``Z``, ``X``), as ``/proc/<pid>/stat`` reports it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("T", "t", "Z", "X", "x")


async def monitor(pod: PodServer) -> None:
    """Check the instances every ``health_interval_s`` until TorchServe is gone (raises
    :class:`TorchServeGoneError` after failing every queued request)."""
    assert pod.runtime is not None and pod.dispatcher is not None
    runtime = pod.runtime
    while True:
        await asyncio.sleep(pod.opts.health_interval_s)
        if not runtime.running:
            pod.dispatcher.fail("the model server is gone")  # queued clients: 503 now
            raise TorchServeGoneError(f"TorchServe exited:\n{runtime.log_tail()}")
        if not await runtime.ping(timeout_s=pod.opts.health_timeout_s):
            for i, inst in enumerate(pod.instances):
                if pod.health[inst.name].up:
                    log.warning("instance %s: TorchServe's frontend does not answer", inst.name)
                pod.health[inst.name].up = False
                pod.health[inst.name].status = "UNRESPONSIVE"
                pod.dispatcher.set_up(i, False)
                pod.health[inst.name].note(asyncio.get_running_loop().time())
            continue
        async with pod.lock:
            await check_instances(pod, initial=False)
            pids = {n: h.pid for n, h in pod.health.items() if h.up and h.pid is not None}
            if reclaim(pids, limit=pod.memory_limit) is not None:  # a leak: that worker goes
                continue  # (the next check sees its new pid, warms it and marks it up)
        now = asyncio.get_running_loop().time()
        for h in pod.health.values():
            h.note(now)


async def check_instances(pod: PodServer, *, initial: bool) -> None:
    """Mark each instance up or down from its worker's state, warming new workers first;
    ``initial``: wait until every one is up, and let a failed warm-up raise."""
    assert pod.runtime is not None and pod.dispatcher is not None
    ts, dispatcher = pod.runtime, pod.dispatcher

    async def check(i: int, inst: InstanceSpec) -> None:
        health = pod.health[inst.name]
        workers = await ts.workers(inst.name)
        ready = [w for w in workers if w.ready and w.pid and process_runnable(w.pid)]
        health.status = workers[0].status if workers else "MISSING"
        if workers and not ready and workers[0].ready:
            health.status = "STOPPED"  # READY to TorchServe, but stopped or a zombie
        if not ready:
            health.up = False
            dispatcher.set_up(i, False)
            return
        pid = ready[0].pid
        if health.pid is not None and pid != health.pid:
            health.restarts += 1
            pod.metrics.instance_restarts.labels(pod.name, inst.name).inc()
            log.warning("instance %s: worker restarted (pid %s -> %s)", inst.name, health.pid, pid)
        health.pid = pid
        if health.warmed_pid != pid:
            health.up = False
            dispatcher.set_up(i, False)
            try:
                await pod.warm(inst)
            except (TimeoutError, RuntimeError, aiohttp.ClientError) as exc:
                if initial:
                    raise
                log.warning("instance %s: warm-up failed, retrying: %s", inst.name, exc)
                return
            health.warmed_pid = pid
        health.up = True
        dispatcher.set_up(i, True)

    await asyncio.gather(*(check(i, inst) for i, inst in enumerate(pod.instances)))
    while initial and not all(h.up for h in pod.health.values()):
        # Registration is synchronous, so workers exist; wait until each is READY.
        await asyncio.sleep(0.2)
        if not ts.running:
            raise TorchServeGoneError(f"TorchServe exited:\n{ts.log_tail()}")
        await asyncio.gather(*(check(i, inst) for i, inst in enumerate(pod.instances)))


# Requests in a warm-up batch. One: a worker forked from the zygote (its model built or
# mapped, its code paged in) runs its first full batch at steady speed after a batch of
# one (ResNet-50, one thread: the first batch of 2 after it 0.30 s against 0.25-0.27 s
# steady, of 8 1.38 s against 1.07-1.46 s; docs/measurements.md, issue 25), and a batch
# of B took B samples' time on the pod's start path and in every in-pod switch.
WARMUP_REQUESTS = 1


async def warm(pod: PodServer, inst: InstanceSpec) -> None:
    """A batch of :data:`WARMUP_REQUESTS` straight to the instance; its answers must not be
    server errors."""
    if pod.warmup is None:
        return
    assert pod.runtime is not None
    runtime, body = pod.runtime, pod.warmup
    headers = {"Content-Type": "application/octet-stream"}

    async def one() -> int:
        return (await runtime.forward(inst.name, headers, {}, body)).status

    count = min(WARMUP_REQUESTS, inst.batch)
    statuses = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    bad = [s for s in statuses if not isinstance(s, int) or s >= 500]
    if bad:
        raise RuntimeError(f"warm-up of {inst.name} failed: {bad[:3]}")
    log.info("instance %s warmed with a batch of %d", inst.name, count)
