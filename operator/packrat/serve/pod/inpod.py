"""The in-pod plan switch: a new plan's instances beside the old ones, in the same runtime.

When a plan change keeps the pod's cores, model and image (the common case: the batch size
changed), a new pod is not needed. :class:`InPodSwitch` adds the new plan's instances
to the running runtime backend (TorchServe registrations or native workers) under new
names (generation ``g``: ``{model}_g{g}_i{k}``), each
pinned to its cores by the same settings file, waits until every worker is READY, warms
each with one batch, and only then moves the dispatcher over in one step
(:meth:`packrat.serve.dispatcher.app.Dispatcher.swap`): every new request goes to the new set,
while requests already queued or in flight on the old set finish there. Once the old set is
idle (at most ``drain_seconds``) its registrations are removed, which stops its workers.
No new pod, no new JVM, no Service change.

If a new instance does not register, does not become READY or fails its warm-up, whatever
was registered is removed again and the old plan keeps serving; the caller gets the reason.
One switch at a time: a second request while one is under way is refused (409), and a
switch waits for the previous one's drain to end.

:func:`admin_routes` is the trigger: ``POST /admin/plan`` with the plan JSON
(``packrat plan --format json``) and ``Authorization: Bearer <token>``. Without a token the
route does not exist, so a pod whose operator gave it none cannot be reconfigured by anyone
who can reach its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from packrat.plan.optimizer import Plan
from packrat.serve.auth import AdminToken, bearer_accepted
from packrat.serve.config import InstanceSpec, ServeConfigError, parse_plan, plan_instances

if TYPE_CHECKING:
    from packrat.serve.pod.server import PodServer

log = logging.getLogger(__name__)

MAX_PLAN_BYTES = 64 * 1024  # a plan is a few hundred bytes; refuse anything much larger


class SwitchError(RuntimeError):
    """The switch was refused or failed; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class InPodSwitch:
    """Switches a running :class:`~packrat.serve.pod.server.PodServer` to a new plan in place."""

    def __init__(self, pod: PodServer, *, ready_timeout_s: float = 300.0) -> None:
        self.pod = pod
        self.ready_timeout_s = ready_timeout_s
        self._busy = asyncio.Lock()
        self._retiring: asyncio.Task[None] | None = None

    async def switch(self, plan: Plan) -> dict[str, Any]:
        """Serve ``plan`` from now on; returns what happened (for the HTTP answer)."""
        if self._busy.locked():
            raise SwitchError(409, "a plan switch is already under way")
        async with self._busy:
            if self._retiring is not None:  # the previous switch's drain
                await self._retiring
                self._retiring = None
            return await self._switch(plan)

    async def _switch(self, plan: Plan) -> dict[str, Any]:
        pod = self.pod
        runtime, dispatcher = pod.runtime, pod.dispatcher
        if runtime is None or dispatcher is None or not dispatcher.ready:
            raise SwitchError(503, "the pod is not serving yet; nothing to switch")
        old_plan = pod.opts.plan
        if plan.engine != "eager" and pod.opts.runtime != "native":
            raise SwitchError(
                400, f"the {pod.opts.runtime} runtime serves eager plans only, not {plan.engine}"
            )
        if plan.to_dict() == old_plan.to_dict():
            return {"switched": False, "plan": plan.label, "message": "already serving it"}
        from packrat.serve.pod.server import resolve_cores

        try:
            _, cores = resolve_cores(plan, pod.cpus)
        except ServeConfigError as exc:
            raise SwitchError(400, str(exc)) from None
        generation = pod.generation + 1
        new = plan_instances(plan, model=pod.name, cores=cores, generation=generation)
        start = time.monotonic()
        log.info("in-pod switch: %s -> %s (generation %d)", old_plan.label, plan.label, generation)
        pod.write_settings([*pod.instances, *new])
        registered: list[str] = []
        try:
            pids = await self._start(new, registered)
        except Exception as exc:
            await self._unregister(registered)
            pod.write_settings(pod.instances)
            message = f"new plan {plan.label} did not start, still serving {old_plan.label}: {exc}"
            log.warning("in-pod switch: %s", message)
            raise SwitchError(503, message) from None
        started = time.monotonic() - start
        async with pod.lock:  # the monitor never sees half a swap
            old = pod.instances
            old_slots = dispatcher.swap(new)
            pod.adopt(plan, new, pids, generation=generation)
        serving = time.monotonic() - start
        log.info(
            "in-pod switch: serving %s after %.2f s (instances ready after %.2f s)",
            plan.label,
            serving,
            started,
        )
        self._retiring = asyncio.create_task(self._retire(old_slots, old))
        return {
            "switched": True,
            "from": old_plan.label,
            "plan": plan.label,
            "instances": [inst.name for inst in new],
            "ready_s": round(started, 3),
            "serving_s": round(serving, 3),
        }

    async def _start(self, new: Sequence[InstanceSpec], registered: list[str]) -> list[int]:
        pod = self.pod
        assert pod.runtime is not None
        ts = pod.runtime

        async def one(inst: InstanceSpec) -> int:
            registered.append(inst.name)  # removed again if anything fails, even half-added
            await ts.add(inst)
            deadline = time.monotonic() + self.ready_timeout_s
            while True:
                workers = await ts.workers(inst.name)
                ready = [w.pid for w in workers if w.ready and w.pid]
                if ready:
                    break
                if not ts.running:
                    raise RuntimeError(f"the {ts.kind} runtime exited")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{inst.name} not READY in {self.ready_timeout_s:.0f} s")
                await asyncio.sleep(0.1)
            await pod.warm(inst)
            return ready[0]

        return list(await asyncio.gather(*(one(inst) for inst in new)))

    async def _retire(self, old_slots: Any, old: Sequence[InstanceSpec]) -> None:
        pod = self.pod
        assert pod.dispatcher is not None
        idle = await pod.dispatcher.retire(old_slots, old, timeout_s=pod.opts.drain_seconds)
        if not idle:
            log.warning("in-pod switch: old instances still busy after the drain; removing them")
        await self._unregister([inst.name for inst in old])
        pod.write_settings(pod.instances)
        log.info("in-pod switch: %s unregistered", ",".join(inst.name for inst in old))

    async def _unregister(self, names: Sequence[str]) -> None:
        ts = self.pod.runtime
        if ts is None or not ts.running:
            return
        results = await asyncio.gather(*(ts.remove(n) for n in names), return_exceptions=True)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("in-pod switch: could not unregister %s: %s", name, result)

    @property
    def busy(self) -> bool:
        """A switch is under way (its drain not counted)."""
        return self._busy.locked()

    async def close_after_drain(self) -> None:
        """Wait for the last switch's drain and unregistration to end."""
        if self._retiring is not None:
            await self._retiring
            self._retiring = None

    async def close(self) -> None:
        if self._retiring is not None:
            self._retiring.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retiring


def _answer(status: int, doc: dict[str, Any]) -> web.Response:
    return web.json_response(doc, status=status)


def admin_routes(switch: InPodSwitch, token: AdminToken) -> list[web.RouteDef]:
    """``POST /admin/plan`` (bearer ``token``, or a token a
    :class:`~packrat.serve.auth.TokenFile` accepts now), or nothing when there is no token."""
    if not token:
        return []

    async def handle_plan(request: web.Request) -> web.Response:
        if not bearer_accepted(request.headers.get("Authorization", ""), token):
            return _answer(401, {"code": 401, "message": "a valid bearer token is required"})
        length = request.content_length
        if length is None or length > MAX_PLAN_BYTES:
            return _answer(413, {"code": 413, "message": f"a plan is at most {MAX_PLAN_BYTES} B"})
        text = (await request.read()).decode(errors="replace")
        try:
            plan = parse_plan(text, origin="request body")
        except ServeConfigError as exc:
            return _answer(400, {"code": 400, "message": str(exc)})
        try:
            doc = await switch.switch(plan)
        except SwitchError as exc:
            return _answer(exc.status, {"code": exc.status, "message": str(exc)})
        return _answer(200, doc)

    return [web.post("/admin/plan", handle_plan)]


def plan_body(plan: Plan) -> bytes:
    """The request body :func:`admin_routes` accepts."""
    return json.dumps(plan.to_dict()).encode()
