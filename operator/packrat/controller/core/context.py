"""What one reconcile pass carries: settings, the model, the observed children, the status
being built and what the pass did (``Result``), with the helpers every step uses."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from packrat.controller.api.crd import KIND, PIPELINE_KIND
from packrat.controller.api.drift import merge_patch
from packrat.controller.api.kube import KubeApi
from packrat.controller.api.ownership import conflict_message, owned_by
from packrat.controller.core.overrides import ModelPolicy
from packrat.controller.core.spec import DEFAULT_IMAGE
from packrat.controller.core.status import (
    ModelStatus,
    PipelineStatus,
    Status,
    get_condition,
    now_iso,
    parse_time,
)
from packrat.controller.core.storage import StorageLimits
from packrat.plan.optimizer import Plan

S = TypeVar("S", bound=Status)


@dataclass(frozen=True)
class Config:
    """Operator-wide settings."""

    image: str = DEFAULT_IMAGE
    max_profile_attempts: int = 3
    profile_retry_seconds: float = 30.0
    profile_retry_max_seconds: float = 600.0
    # a profiling pod the scheduler cannot place fails its attempt after this long
    unschedulable_grace_seconds: float = 60.0
    # how often a storageUri model without a digest is checked for a new version (ETag)
    storage_check_seconds: float = 300.0
    # what the operator and its init containers may fetch for model authors (egress policy,
    # largest model, cloud identity)
    storage: StorageLimits = field(default_factory=StorageLimits)
    # the pipeline planner's child process: wall seconds and MiB of address space
    pipeline_plan_seconds: float = 60.0
    pipeline_plan_memory_mib: int = 320
    # the platform's allow-lists for images, service accounts, priority classes, env Secrets
    policy: ModelPolicy = field(default_factory=ModelPolicy)
    # how often each model's admin token Secret gets a new token (0: never); at least 600 s
    # (serving.admin_token.MIN_ROTATION_SECONDS, checked where it is set)
    admin_token_rotation_seconds: float = 24 * 3600.0


@dataclass(frozen=True)
class Again:
    """Why a pass asks to run again before the resync: something is in progress (profiling,
    a switch, pods starting: ``waiting``, look again at the poll interval), and/or a step
    asked for a look within ``within`` seconds (a backoff, an estimate due, a token to
    rotate). :mod:`packrat.controller.planning.schedule` turns it into the next delay."""

    waiting: bool = False
    within: float | None = None

    def soon(self) -> Again:
        """Something is in progress."""
        return Again(waiting=True, within=self.within)

    def within_seconds(self, seconds: float) -> Again:
        """At most ``seconds`` from now (the smallest any step asked: a step never lengthens
        another's)."""
        within = seconds if self.within is None else min(self.within, seconds)
        return Again(waiting=self.waiting, within=within)


@dataclass
class Result:
    """What a pass did, for metrics, events and logs, and when it asks to run again."""

    phase: str = "Pending"
    result: str = "ok"
    switch_result: str | None = None
    profiling_seconds: float | None = None
    plan: Plan | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    # autoBatch: the combined observation and the decision of this pass, if any
    observed_batch: int | None = None
    decision: str | None = None
    # seconds from the start of a completed switch to the Service selecting the new slot
    switch_seconds: float | None = None
    # why the pass asks to run again before the resync (the one value the schedule reads)
    again: Again = field(default_factory=Again)
    # the running profiling Job's progress (status.profiling.progress)
    profiling_progress: dict[str, Any] | None = None
    # the stored profile's isolation verdict (CoresExclusive); None when it has none
    cores_exclusive: bool | None = None
    # spec.autoscaling envelope: the tuner's decision of this pass (action, rates, capacity)
    autoscale: dict[str, Any] | None = None

    def in_progress(self) -> None:
        """Something is in progress (profiling, a switch, pods starting): look again soon."""
        self.again = self.again.soon()

    def again_within(self, seconds: float) -> None:
        """Look again after at most ``seconds`` (the smallest any step of the pass asked:
        a step never lengthens another's)."""
        self.again = self.again.within_seconds(seconds)

    @property
    def waiting(self) -> bool:
        """Something is in progress (``again.waiting``)."""
        return self.again.waiting

    @property
    def retry_seconds(self) -> float | None:
        """The look within the pass asked for (``again.within``)."""
        return self.again.within


@dataclass
class Pass(Generic[S]):
    """The state of one pass; ``status`` is a private copy, written only if the pass ends."""

    kube: KubeApi
    config: Config
    obj: Mapping[str, Any]
    status: S
    result: Result
    now: datetime.datetime
    conflicts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    def owns(self, child: Mapping[str, Any]) -> bool:
        """Whether ``child`` is this object's (its ownerReference: never adopt another's)."""
        kind = PIPELINE_KIND if isinstance(self.status, PipelineStatus) else KIND
        return owned_by(child, name=self.name, uid=self.obj["metadata"].get("uid"), kind=kind)

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "default")

    @property
    def generation(self) -> int | None:
        gen = self.obj["metadata"].get("generation")
        return gen if isinstance(gen, int) else None

    def emit(self, kind: str, reason: str, message: str) -> None:
        self.result.events.append((kind, reason, message))

    def cond(self, type_: str, value: bool, reason: str, message: str = "") -> None:
        self.status.set_condition(
            type_, value, reason, message, generation=self.generation, now=now_iso(self.now)
        )

    def seconds_since(self, start: str | None, now: datetime.datetime | None = None) -> float:
        parsed = parse_time(start)
        return ((now or self.now) - parsed).total_seconds() if parsed else 0.0

    def conflict(self, kind: str, name: str) -> None:
        if (kind, name) not in self.conflicts:
            self.conflicts.append((kind, name))

    def report_conflicts(self, owner: str = KIND) -> None:
        """The ``OwnershipConflict`` condition for this pass's conflicts (``owner``: the
        kind of this object), with a Warning event when they are new or changed (not every
        pass); ``Resolved`` once they are gone."""
        previous = get_condition(self.status.get("conditions"), "OwnershipConflict") or {}
        if self.conflicts:
            message = conflict_message(self.conflicts, owner=owner)
            if previous.get("status") != "True" or previous.get("message") != message:
                self.emit("Warning", "OwnershipConflict", message)
            self.cond("OwnershipConflict", True, "NotOwned", message)
        elif previous.get("status") == "True":
            self.cond("OwnershipConflict", False, "Resolved", "")


ModelPass = Pass[ModelStatus]
PipelinePass = Pass[PipelineStatus]


def run_pass(
    kube: KubeApi,
    config: Config,
    plural: str,
    namespace: str,
    name: str,
    *,
    status: Callable[[Mapping[str, Any]], S],
    step: Callable[[Pass[S]], None],
    now: datetime.datetime | None = None,
    on_gone: Callable[[], object] | None = None,
) -> Result:
    """One pass over the object ``plural/namespace/name``: ``step`` works on a private copy of
    its status (``status`` makes it from the stored one); only when it returns are phase (the
    status's phase machine) and observedGeneration set and the difference written (an
    exception propagates and nothing is written). An object gone or being deleted gets
    ``on_gone`` instead, and the result "gone"."""
    obj = kube.get(plural, namespace, name)
    result = Result()
    if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
        if on_gone is not None:
            on_gone()
        result.result = "gone"
        return result
    old_status = dict(obj.get("status") or {})
    p = Pass(
        kube=kube,
        config=config,
        obj=obj,
        status=status(old_status),
        result=result,
        now=now or datetime.datetime.now(datetime.UTC),
    )
    step(p)
    result.phase = p.status.finish(p.generation)
    new_status = p.status.to_dict()
    if new_status != old_status:
        patch = merge_patch(old_status, new_status)
        kube.patch_status(plural, namespace, name, {"status": patch})
    return result


def report_provisioned(p: Pass[Any], *, feasible: bool, changed: bool, summary: str) -> None:
    """The ``Provisioned`` condition of a provisioning (a model's SLO or a pipeline's): True
    when the SLO is met by the chosen configuration, else False (``Infeasible``: the lowest
    simulated P99 is served); an event when the provisioning changed."""
    if feasible:
        if changed:
            p.emit("Normal", "Provisioned", summary)
        p.cond("Provisioned", True, "Feasible", summary)
        return
    message = f"SLO infeasible, serving the lowest simulated P99: {summary}"
    if changed:
        p.emit("Warning", "SloInfeasible", message)
    p.cond("Provisioned", False, "Infeasible", message)
