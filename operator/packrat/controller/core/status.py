"""Pure status logic: the phase machine and standard Kubernetes conditions.

Phases and conditions are what users and tools read (``kubectl get prm``, ``kubectl wait
--for=condition=Ready``), so their rules live here, free of I/O and unit-tested:
``lastTransitionTime`` moves only when a condition's status flips.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.plans import from_status, to_status
from packrat.plan.optimizer import Plan

PHASES = ("Pending", "Profiling", "Planning", "Deploying", "Ready", "Reconfiguring", "Failed")
CONDITION_TYPES = ("Profiled", "Planned", "Ready", "Reconfiguring", "Degraded")


def now_iso(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new conditions list with ``type_`` set; other conditions are kept as they are.

    ``lastTransitionTime`` is kept when the status does not change (reason and message may).
    """
    value = status if isinstance(status, str) else ("True" if status else "False")
    if value not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown, got {value!r}")
    stamp = now or now_iso()
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        changed = cond.get("status") != value
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp if changed else cond.get("lastTransitionTime", stamp),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    if not found:
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(str(c.get("type")), len(order)))


def get_condition(
    conditions: Sequence[Mapping[str, Any]] | None, type_: str
) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return bool(cond and cond.get("status") == "True")


@dataclass(frozen=True)
class Facts:
    """What one reconcile pass found; the phase follows from it."""

    invalid: bool = False
    failed: bool = False
    profiled: bool = False
    profiling: bool = False
    planned: bool = False
    deployed: bool = False
    ready_replicas: int = 0
    replicas: int = 1
    switching: bool = False


def derive_phase(facts: Facts) -> str:
    """The phase machine: Pending -> Profiling -> Planning -> Deploying -> Ready, with
    Reconfiguring during a slot switch and Failed for invalid specs and exhausted retries."""
    if facts.invalid or facts.failed:
        return "Failed"
    if not facts.profiled:
        return "Profiling" if facts.profiling else "Pending"
    if not facts.planned or not facts.deployed:
        return "Planning" if not facts.planned else "Deploying"
    if facts.switching:
        return "Reconfiguring"
    if facts.ready_replicas >= facts.replicas:
        return "Ready"
    return "Deploying"


@dataclass(frozen=True)
class PipelineFacts:
    """What one pipeline pass found; the pipeline's phase follows from it."""

    failed: bool = False
    serving: bool = False
    missing_profiles: bool = True


def derive_pipeline_phase(facts: PipelineFacts) -> str:
    """The pipeline's phase machine: Pending (stage profiles missing) -> Provisioning
    (stages and router deploying) -> Serving, and Failed."""
    if facts.failed:
        return "Failed"
    if facts.serving:
        return "Serving"
    return "Pending" if facts.missing_profiles else "Provisioning"


class Status(Mapping[str, Any]):
    """A pass's private copy of an object's status: read as a mapping (every value a copy),
    written only through its methods, which :func:`packrat.controller.core.context.run_pass`
    diffs against what was stored and writes once, when the pass ends. The phase is not
    written by any step: steps report what they found and ``phase`` derives it, in one
    place."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = copy.deepcopy(dict(stored or {}))

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        """The whole status as plain data (a copy)."""
        return copy.deepcopy(self._data)

    @property
    def phase(self) -> str:
        raise NotImplementedError

    # -- writing: common fields ---------------------------------------------------------------
    def _set(self, key: str, value: Any) -> None:
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = copy.deepcopy(value)

    def set_message(self, message: str | None) -> None:
        """``status.message`` (None removes it)."""
        self._set("message", message)

    def set_endpoint(self, name: str, namespace: str, port: int) -> None:
        self._set("endpoint", {"service": f"{name}.{namespace}.svc", "port": port})
        self._set("url", f"http://{name}.{namespace}.svc:{port}")  # the URL printer column

    def set_condition(
        self,
        type_: str,
        value: bool,
        reason: str,
        message: str = "",
        *,
        generation: int | None,
        now: str,
    ) -> None:
        self._data["conditions"] = set_condition(
            self._data.get("conditions"),
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        )

    def drop_condition(self, type_: str) -> None:
        """Remove the condition of ``type_`` (when there is one)."""
        kept = [c for c in self._data.get("conditions") or [] if c.get("type") != type_]
        if kept != (self._data.get("conditions") or []):
            self._data["conditions"] = kept

    def finish(self, generation: int | None) -> str:
        """Set ``phase`` (the machine's answer) and ``observedGeneration`` as a pass ends;
        returns the phase."""
        phase = self.phase
        self._data["phase"] = phase
        if generation is not None:
            self._data["observedGeneration"] = generation
        return phase


class ModelStatus(Status):
    """A PackratModel's status. Steps report the facts of the pass (``failed``,
    ``profiling``, ``awaiting_plan``, ``switching``, ``serving``); the last one reported
    stands, and ``phase`` derives from it with :func:`derive_phase`."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        super().__init__(stored)
        self._facts = Facts()

    @property
    def phase(self) -> str:
        return derive_phase(self._facts)

    # -- the facts the phase follows from ---------------------------------------------------
    def failed(self, *, invalid: bool = False) -> None:
        self._facts = Facts(invalid=invalid, failed=not invalid)

    def profiling(self) -> None:
        self._facts = Facts(profiling=True)

    def awaiting_plan(self) -> None:
        """Profiled, not planned (a pipeline's stage before its pipeline's plan)."""
        self._facts = Facts(profiled=True)

    def switching(self) -> None:
        self._facts = Facts(profiled=True, planned=True, deployed=True, switching=True)

    def serving(self, *, ready_replicas: int, replicas: int) -> str:
        """Serving from the active slot with ``ready_replicas`` of ``replicas`` ready; the
        phase that follows."""
        self._facts = Facts(
            profiled=True,
            planned=True,
            deployed=True,
            ready_replicas=ready_replicas,
            replicas=replicas,
        )
        return self.phase

    # -- what the active slot serves --------------------------------------------------------
    def set_serving(
        self,
        *,
        slot: str,
        serving_hash: str,
        plan: Plan,
        serving_spec: Mapping[str, Any],
    ) -> None:
        """The last good configuration: the active slot and what it serves."""
        self._data.update(
            activeSlot=slot,
            servingHash=serving_hash,
            plan=to_status(plan),
            servingSpec=copy.deepcopy(dict(serving_spec)),
        )

    @property
    def served_plan(self) -> Plan | None:
        """The plan the active slot serves (None before the first deploy)."""
        return from_status(self._data.get("plan"))

    def keep_serving_spec(self, spec: Mapping[str, Any]) -> None:
        """``servingSpec`` for a status from before it was kept (older operators)."""
        self._data.setdefault("servingSpec", copy.deepcopy(dict(spec)))

    def set_active_slot(self, slot: str) -> None:
        self._data["activeSlot"] = slot

    def set_ready_replicas(self, ready: int) -> None:
        self._data["readyReplicas"] = int(ready)

    def set_scale(self, replicas: int, selector: str) -> None:
        """``status.replicas`` and ``status.selector`` (the scale subresource)."""
        self._data["replicas"] = int(replicas)
        self._data["selector"] = selector

    # -- batch size, switches ---------------------------------------------------------------
    def set_batch_size(self, batch: Mapping[str, Any]) -> None:
        """``status.batchSize`` (autoBatch's observations and decision, current and target)."""
        self._set("batchSize", dict(batch))

    def batch_switching(self, *, current: Any, target: Any) -> None:
        """A switch from batch ``current`` to ``target`` under way."""
        self._set("batchSize", {**self.get("batchSize", {}), "current": current, "target": target})

    def batch_settled(self, current: Any) -> None:
        """Serving batch ``current``, no switch under way."""
        batch = {**self.get("batchSize", {}), "current": current}
        batch.pop("target", None)
        self._set("batchSize", batch)

    def batch_target_dropped(self) -> None:
        batch = {k: v for k, v in self.get("batchSize", {}).items() if k != "target"}
        self._set("batchSize", batch)

    def set_switch(self, switch: Mapping[str, Any] | None, *, plan: Plan | None = None) -> None:
        """``status.switch`` (a switch under way or given up; None: none), with the plan it
        switches to, if any."""
        doc = None if switch is None else dict(switch)
        if doc is not None and plan is not None:
            doc["plan"] = to_status(plan)
        self._set("switch", doc)

    @property
    def switch_plan(self) -> Plan | None:
        """The plan the switch under way switches to."""
        return from_status((self._data.get("switch") or {}).get("plan"))

    def record_switch(
        self, last: Mapping[str, Any], entry: Mapping[str, Any], *, limit: int = 10
    ) -> None:
        """``status.lastSwitch`` and one more entry in the bounded ``switchHistory``."""
        self._set("lastSwitch", dict(last))
        history = [dict(h) for h in self._data.get("switchHistory") or []]
        history.append(copy.deepcopy(dict(entry)))
        self._data["switchHistory"] = history[-limit:]

    # -- profile, storage, provisioning, autoscaling ----------------------------------------
    def set_profile(self, profile: Mapping[str, Any]) -> None:
        self._set("profile", dict(profile))

    def set_profiling_progress(self, progress: Mapping[str, Any] | None) -> None:
        """``status.profiling.progress`` while a profiling Job runs (None removes it)."""
        self._set("profiling", None if progress is None else {"progress": dict(progress)})

    def set_storage(self, storage: Mapping[str, Any]) -> None:
        self._set("storage", dict(storage))

    def set_measured(self, measured: Mapping[str, Any] | None) -> None:
        self._set("measured", None if measured is None else dict(measured))

    def set_provisioning(self, provisioning: Mapping[str, Any]) -> None:
        self._set("provisioning", dict(provisioning))

    def set_autoscaling(self, autoscaling: Mapping[str, Any]) -> None:
        self._set("autoscaling", dict(autoscaling))

    def set_canary(self, canary: Mapping[str, Any] | None) -> None:
        """``status.canary`` (spec.canary's rollout; None removes it)."""
        self._set("canary", None if canary is None else dict(canary))


class PipelineStatus(Status):
    """A PackratPipeline's status; ``phase`` derives from the facts the pass reports with
    :func:`derive_pipeline_phase`."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        super().__init__(stored)
        self._facts = PipelineFacts()

    @property
    def phase(self) -> str:
        return derive_pipeline_phase(self._facts)

    def failed(self) -> None:
        self._facts = PipelineFacts(failed=True)

    def waiting(self, *, missing_profiles: bool) -> None:
        self._facts = PipelineFacts(missing_profiles=missing_profiles)

    def serving(self) -> None:
        self._facts = PipelineFacts(serving=True)

    def set_measured(self, queries: int, p99_ms: float | None) -> None:
        """The routers' measured end-to-end latency over the trailing window (``p99_ms``
        None: too few queries in it)."""
        self._data["measuredQueries"] = int(queries)
        self._set("measuredP99Ms", p99_ms)

    def set_edges(self, edges: list[dict[str, Any]] | None) -> None:
        """``status.edges``: per edge the declared fraction, the measured one (smoothed, its
        weight and samples) and the one the planner uses once there are enough samples."""
        self._set("edges", edges)

    def judge_slo(self, slo_ms: float) -> None:
        """``sloMet`` from the measured P99 when there is one (else the simulated one's)."""
        if "measuredP99Ms" in self._data:
            self._data["sloMet"] = bool(self._data["measuredP99Ms"] <= slo_ms)

    def set_plan(
        self,
        *,
        signature: str,
        cores: int,
        simulated_p99_ms: float | None,
        slo_met: bool,
        baselines: Mapping[str, Any],
    ) -> None:
        self._data.update(
            planSignature=signature,
            cores=cores,
            sloMet=slo_met,
            baselines=copy.deepcopy(dict(baselines)),
        )
        self._set("simulatedP99Ms", simulated_p99_ms)

    def set_planning(self, failure: Mapping[str, Any] | None) -> None:
        """The last planning run over its budget (signature, reason, message), or None."""
        self._set("planning", dict(failure) if failure is not None else None)

    def set_stages(self, stages: Sequence[Mapping[str, Any]]) -> None:
        self._data["stages"] = [copy.deepcopy(dict(s)) for s in stages]

    def set_router(self, replicas: int, ready_replicas: int) -> None:
        self._data["router"] = {"replicas": int(replicas), "readyReplicas": int(ready_replicas)}
