"""The active-passive switch: render into the passive slot, wait until ready, move the
Service, drain, retire the old slot; abort (keeping the active slot) when it is not ready
in time. All progress lives in ``status.switch``, so any pass (or a restarted operator)
continues where the last one stopped."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import SwitchTiming
from packrat.controller.core.status import Stage, Switch, now_iso, parse_time
from packrat.controller.planning import autobatch as ab
from packrat.controller.serving import manifests as m
from packrat.controller.serving.service import ensure_service
from packrat.controller.serving.slots import Rendering, deployment_ready, ensure_deployment, scale

Children = Mapping[str, Mapping[str, Any] | None]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# spec fields the serving template is built from besides the plan (see ``serving_hash``)
_TEMPLATE_FIELDS = (
    *("image", "model", "memory", "maxBatchDelayMs", "runtime"),
    *("nodeSelector", "tolerations", "affinity"),
)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between the served spec and the new one in the template's fields
    (scalars with both values, structures by name only: a message stays short)."""
    out: list[str] = []
    for key in _TEMPLATE_FIELDS:
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
            out.append(f"{key} changed")
        else:
            out.append(f"{key} {str(a)[:64]} -> {str(b)[:64]}")
    return out


def start_switch(
    p: Pass, deployments: Children, *, target: Rendering, replicas: int, note: str = ""
) -> None:
    """Render ``target`` into the passive slot and start waiting for it (``note``: why the
    plan change is not switched in place, when it could have been)."""
    status = p.status
    active = str(status["activeSlot"])
    slot = m.other_slot(active)
    old_plan = status.served_plan
    old_label, old_batch = (old_plan.label, old_plan.batch) if old_plan else (None, None)
    plan = target.plan
    reason = f"plan {old_label} -> {plan.label}"
    changes = _changed(status.serving_spec_doc, target.spec.stored_spec())
    if old_batch != plan.batch:
        changes.insert(0, f"batch {old_batch} -> {plan.batch}")
    if changes:
        reason += f" ({', '.join(changes)})"
    if note:
        reason += f"; in-pod switch failed: {note}"
    ensure_deployment(p, deployments.get(slot), slot=slot, rendering=target, replicas=replicas)
    status.set_switch(
        Switch.rollout(
            from_slot=active,
            target_slot=slot,
            serving_hash=target.serving_hash,
            spec=target.spec.stored_spec(),
            reason=reason,
            started_at=now_iso(p.now),
            plan=plan,
        )
    )
    status.batch_switching(current=old_batch, target=plan.batch)
    message = f"switching to slot {slot}: {reason}"
    status.set_message(message)
    p.emit("Normal", "SwitchStarted", message)
    p.cond("Reconfiguring", True, "SwitchStarted", message)
    status.switching()
    p.result.in_progress()


def advance_switch(
    p: Pass,
    deployments: Children,
    service: Mapping[str, Any] | None,
    *,
    target: Rendering,
    replicas: int,
    timing: SwitchTiming,
) -> bool:
    """One step of a switch under way (``timing``: the spec's readiness timeout and drain);
    True when it ended (done or aborted)."""
    ready_timeout, drain = timing.ready_timeout_seconds, timing.drain_seconds
    status = p.status
    switch = status.switch
    assert switch is not None and switch.from_slot is not None
    slot, source = switch.target_slot, switch.from_slot
    status.switching()
    p.result.in_progress()
    elapsed = p.seconds_since(switch.started_at)
    if switch.stage is Stage.ROLLOUT:
        dep = ensure_deployment(
            p, deployments.get(slot), slot=slot, rendering=target, replicas=replicas
        )
        if deployment_ready(dep, replicas) and not p.conflicts:
            ready_seconds = round(elapsed, 3)
            ensure_service(p, service, slot=slot)
            switch = switch.moved(
                ready_seconds=ready_seconds,
                switched_seconds=round(p.seconds_since(switch.started_at, _now()), 3),
                drain_until=now_iso(p.now + datetime.timedelta(seconds=drain)),
            )
            status.set_switch(switch)
            status.set_serving(
                slot=slot,
                serving_hash=str(switch.hash),
                plan=switch.plan or target.plan,
                serving_spec=switch.spec or target.spec.stored_spec(),
            )
            message = f"service moved to slot {slot}; draining slot {source} for {drain:.0f}s"
            status.set_message(message)
            p.emit("Normal", "ServiceSwitched", message)
            p.cond("Reconfiguring", True, "Draining", message)
            return False
        if elapsed > ready_timeout:
            abort(p, deployments, reason=f"slot {slot} not ready within {ready_timeout:.0f}s")
            return True
        ready = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
        status.set_message(
            f"switching to slot {slot}: {ready}/{replicas} ready after {elapsed:.0f}s"
        )
        status.set_switch(switch)
        return False
    # draining: the Service already selects the target; wait, then retire the old slot
    drain_until = parse_time(switch.drain_until)
    if drain_until is not None and p.now < drain_until:
        return False
    scale(p, deployments.get(source), 0)
    _finish(p, switch, source=source, slot=slot, elapsed=elapsed)
    return True


def _finish(p: Pass, switch: Switch, *, source: str, slot: str, elapsed: float) -> None:
    status = p.status
    timeline = {
        "passiveReadySeconds": float(switch.ready_seconds or 0.0),
        "selectorSwitchSeconds": float(switch.switched_seconds or 0.0),
        "oldSlotScaledDownSeconds": round(elapsed, 3),
    }
    last = {
        "time": now_iso(p.now),
        "reason": switch.reason,
        "result": "Succeeded",
        "mode": "Deployment",
        "fromSlot": source,
        "toSlot": slot,
        "plan": switch.plan_label,
        "timeline": timeline,
    }
    status.set_switch(None)
    before = status.batch_current
    status.batch_settled(switch.plan_batch)
    status.record_switch(
        last,
        {
            **{k: v for k, v in last.items() if k != "timeline"},
            "fromBatch": before,
            "toBatch": switch.plan_batch,
            "seconds": timeline["selectorSwitchSeconds"],
        },
        limit=ab.HISTORY_LIMIT,
    )
    p.result.switch_result = "succeeded"
    p.result.switch_seconds = timeline["selectorSwitchSeconds"]
    message = f"switch to slot {slot} done ({switch.reason})"
    p.emit("Normal", "SwitchCompleted", message)
    p.cond("Reconfiguring", False, "SwitchCompleted", message)


def end_switch(p: Pass, *, reason: str) -> None:
    """End a switch under way now, the target slot left as it is (the active slot's Deployment
    was deleted: ``failover`` takes the target slot over). A rollout is aborted (its spec
    never served); a drain is complete (the Service already selects the new slot)."""
    switch = p.status.switch
    if switch is None:
        return
    if switch.stage is Stage.ROLLOUT:
        abort(p, {}, reason=reason)
    elif switch.stage is Stage.DRAINING:
        elapsed = p.seconds_since(switch.started_at)
        source = str(switch.from_slot)
        _finish(p, switch, source=source, slot=switch.target_slot, elapsed=elapsed)


def abort(p: Pass, deployments: Children, *, reason: str) -> None:
    """Give a rollout up: the target slot (if in ``deployments``) is scaled down."""
    status = p.status
    active = str(status.get("activeSlot"))
    switch = status.switch or Switch(stage=Stage.ROLLOUT, target_slot=m.other_slot(active))
    slot = switch.target_slot
    scale(p, deployments.get(slot), 0)
    status.set_switch(switch.aborted(reason))
    last = {
        "time": now_iso(p.now),
        "reason": f"{switch.reason}: {reason}",
        "result": "Aborted",
        "mode": "Deployment",
        "fromSlot": active,
        "toSlot": slot,
        "plan": switch.plan_label,
    }
    p.result.switch_result = "aborted"
    status.record_switch(
        last,
        {**last, "fromBatch": status.batch_current, "toBatch": switch.plan_batch},
        limit=ab.HISTORY_LIMIT,
    )
    status.batch_target_dropped()
    message = f"switch aborted ({reason}); still serving slot {active}"
    p.emit("Warning", "SwitchAborted", message)
    p.cond("Reconfiguring", False, "SwitchAborted", message)
