"""One level-triggered reconcile pass for a PackratModel.

Each pass reads the object and its children fresh from the API, takes the next step
(validate, profile, plan, deploy, switch slots) and writes what it did to ``status``. Every step
is idempotent and all progress lives in ``status`` (the switch stage, its target, deadlines),
so a pass can be repeated, interrupted or run by a freshly restarted operator without
duplicate Jobs, double switches or lost slots. Waiting is expressed by returning: the kopf
timer calls the pass again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packrat.controller import autobatch as ab
from packrat.controller import manifests as m
from packrat.controller.kube import KubeApi
from packrat.controller.progress import parse_progress
from packrat.controller.spec import (
    DEFAULT_IMAGE,
    initial_batch,
    profile_key,
    serving_hash,
    validate_spec,
    with_defaults,
)
from packrat.controller.status import Facts, derive_phase, now_iso, parse_time, set_condition
from packrat.plan.optimizer import Optimizer, Plan, PlanError
from packrat.plan.profile import Profile, ProfileError, parse_profile
from packrat.plan.reconfig import decide

logger = logging.getLogger(__name__)

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)


@dataclass(frozen=True)
class Config:
    """Operator-wide settings."""

    image: str = DEFAULT_IMAGE
    max_profile_attempts: int = 3
    profile_retry_seconds: float = 30.0
    profile_retry_max_seconds: float = 600.0


@dataclass
class Result:
    """What a pass did, for metrics and logs."""

    phase: str = "Pending"
    result: str = "ok"
    switch_result: str | None = None
    profiling_seconds: float | None = None
    plan: dict[str, Any] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    # autoBatch: the combined observation and the decision of this pass, if any
    observed_batch: int | None = None
    decision: str | None = None
    # seconds from the start of a completed switch to the Service selecting the new slot
    switch_seconds: float | None = None
    # the running profiling Job's progress (status.profiling.progress)
    profiling_progress: dict[str, Any] | None = None


def _plan_dict(plan: Plan) -> dict[str, Any]:
    data = plan.to_dict()
    data.pop("alternatives", None)
    return data


def status_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The plan as shown in ``status.plan`` (camelCase; printer columns read it)."""
    return {
        "label": plan.get("label"),
        "cpus": plan.get("cpus"),
        "batch": plan.get("batch"),
        "instances": [dict(g) for g in plan.get("instances") or []],
        "expectedLatencyMs": plan.get("expected_latency_ms"),
        "fatLatencyMs": plan.get("fat_latency_ms"),
        "expectedSpeedup": plan.get("expected_speedup"),
        "numInstances": plan.get("num_instances"),
        "totalThreads": plan.get("total_threads"),
    }


def wire_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``status.plan`` back in the plan JSON format ``packrat serve --plan-env`` reads."""
    return {
        "cpus": plan.get("cpus"),
        "batch": plan.get("batch"),
        "instances": [dict(g) for g in plan.get("instances") or []],
        "expected_latency_ms": plan.get("expectedLatencyMs"),
        "fat_latency_ms": plan.get("fatLatencyMs"),
        "expected_speedup": plan.get("expectedSpeedup"),
        "num_instances": plan.get("numInstances"),
        "total_threads": plan.get("totalThreads"),
        "label": plan.get("label"),
    }


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _seconds_since(start: str | None, now: datetime.datetime) -> float:
    parsed = parse_time(start)
    return (now - parsed).total_seconds() if parsed else 0.0


def deployment_ready(dep: Mapping[str, Any] | None, replicas: int) -> bool:
    """All wanted pods of the current template are ready."""
    if dep is None:
        return False
    status = dep.get("status") or {}
    generation = dep.get("metadata", {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return False
    if int((dep.get("spec") or {}).get("replicas", 0)) != replicas:
        return False
    if replicas == 0:
        return True
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas", ready) or 0)
    return ready >= replicas and updated >= replicas


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod failed or is stuck: reason, exit code and the last log lines."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            term = state.get("terminated")
            if term and int(term.get("exitCode", 0)) != 0:
                reason = term.get("reason") or "Error"
                message = (term.get("message") or "").strip()
                tail = " | ".join(message.splitlines()[-5:])
                text = f"container {cs.get('name')}: {reason}, exit code {term.get('exitCode')}"
                return f"{text}: {tail}" if tail else text
            waiting = state.get("waiting")
            if waiting and waiting.get("reason") in (
                "ImagePullBackOff",
                "ErrImagePull",
                "CrashLoopBackOff",
                "CreateContainerConfigError",
                "InvalidImageName",
            ):
                return (
                    f"container {cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}"
                )
    if status.get("phase") == "Failed":
        return f"pod failed: {status.get('reason', '')} {status.get('message', '')}".strip()
    return None


def _job_state(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    if int(status.get("succeeded") or 0) > 0:
        return "succeeded"
    return "running"


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    return patch


class Reconciler:
    """Runs passes for one PackratModel object at a time."""

    def __init__(
        self,
        kube: KubeApi,
        *,
        config: Config | None = None,
        estimates: ab.EstimateSource | None = None,
    ) -> None:
        self.kube = kube
        self.config = config or Config()
        # (namespace, name) -> the serving pods' batch-size estimates, for autoBatch
        self.estimates = estimates
        self.optimizers = ab.OptimizerCache()

    # -- entry point -----------------------------------------------------------------------
    def reconcile(
        self, namespace: str, name: str, *, now: datetime.datetime | None = None
    ) -> Result:
        now = now or _now()
        obj = self.kube.get("packratmodels", namespace, name)
        result = Result()
        if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
            result.result = "gone"
            return result
        old_status = dict(obj.get("status") or {})
        status = json.loads(json.dumps(old_status))
        try:
            self._pass(obj, status, result, now=now)
        finally:
            status["phase"] = result.phase
            generation = obj.get("metadata", {}).get("generation")
            if generation is not None:
                status["observedGeneration"] = generation
            if status != old_status:
                patch = merge_patch(old_status, status)
                self.kube.patch(
                    "packratmodels", namespace, name, {"status": patch}, subresource="status"
                )
        return result

    # -- the pass --------------------------------------------------------------------------
    def _emit(self, result: Result, kind: str, reason: str, message: str) -> None:
        result.events.append((kind, reason, message))

    def _cond(  # noqa: PLR0917
        self,
        status: dict[str, Any],
        obj: Mapping[str, Any],
        type_: str,
        value: bool,
        reason: str,
        message: str = "",
        *,
        now: datetime.datetime,
    ) -> None:
        status["conditions"] = set_condition(
            status.get("conditions"),
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            generation=obj.get("metadata", {}).get("generation"),
            now=now_iso(now),
        )

    def _pass(
        self, obj: dict[str, Any], status: dict[str, Any], result: Result, *, now: datetime.datetime
    ) -> None:
        meta = obj["metadata"]
        name, namespace = meta["name"], meta.get("namespace", "default")
        errors = validate_spec(obj.get("spec"), name=name)
        if errors:
            result.phase = "Failed"
            result.result = "invalid"
            message = "; ".join(errors)
            if status.get("message") != message:
                self._emit(result, "Warning", "InvalidSpec", message)
            status["message"] = message
            self._cond(status, obj, "Ready", False, "InvalidSpec", message, now=now)
            return
        spec = with_defaults(obj["spec"])
        obj = {**obj, "spec": spec}
        image = spec.get("image") or self.config.image
        replicas = int(spec["replicas"])

        # 1. profile ---------------------------------------------------------------------
        profile = self._profile(obj, status, result, image=image, now=now)
        if profile is None:
            return

        # 2. plan ------------------------------------------------------------------------
        batch = self._batch(spec, status)
        auto = spec.get("autoBatch")
        max_batch = max(batch, int(auto["max"])) if auto else batch
        try:
            optimizer = self.optimizers.get(
                profile,
                digest=str((status.get("profile") or {}).get("digest", "")),
                cpus=int(spec["cpus"]),
                max_batch=max_batch,
            )
            plan = _plan_dict(optimizer.plan(batch))
        except PlanError as exc:
            result.phase = "Failed"
            result.result = "plan_error"
            message = f"no plan for cpus={spec['cpus']} batch={batch}: {exc}"
            if status.get("message") != message:
                self._emit(result, "Warning", "PlanFailed", message)
            status["message"] = message
            self._cond(status, obj, "Planned", False, "PlanFailed", message, now=now)
            self._cond(status, obj, "Ready", False, "PlanFailed", message, now=now)
            return
        result.plan = plan
        self._cond(status, obj, "Planned", True, "Planned", f"plan {plan['label']}", now=now)
        desired_hash = serving_hash(spec, plan=plan, image=image)

        # 3. Service and slots -----------------------------------------------------------
        active = status.get("activeSlot")
        if self.kube.get("services", namespace, name) is None:
            self.kube.create("services", namespace, m.service(obj, slot=active or "a"))
        status["endpoint"] = {"service": f"{name}.{namespace}.svc", "port": m.PORT}

        if active is None:
            self._first_deploy(obj, status, result, plan=plan, desired_hash=desired_hash, now=now)
            return

        switch = status.get("switch")
        stage = switch.get("stage") if switch else None
        if stage == "draining":
            self._advance_switch(obj, status, result, now=now)
            return
        if stage == "rollout" and switch is not None:
            if switch.get("hash") == desired_hash:
                self._advance_switch(obj, status, result, now=now)
                return
            if desired_hash == status.get("servingHash"):
                self._abort(obj, status, result, reason="spec changed back", now=now)
            else:  # superseded by a newer spec: render it into the passive slot instead
                self._start_switch(
                    obj, status, result, plan=plan, desired_hash=desired_hash, now=now
                )
                return
        if desired_hash != status.get("servingHash"):
            switch = status.get("switch")
            given_up = bool(
                switch and switch.get("stage") == "aborted" and switch.get("hash") == desired_hash
            )
            if not given_up:
                self._start_switch(
                    obj, status, result, plan=plan, desired_hash=desired_hash, now=now
                )
                return
        elif (status.get("switch") or {}).get("stage") == "aborted":
            status.pop("switch", None)

        self._steady(obj, status, result, replicas=replicas, now=now)
        if auto and result.phase == "Ready" and "switch" not in status:
            self._observe_batch(obj, status, result, optimizer=optimizer, profile=profile, now=now)

    def _batch(self, spec: Mapping[str, Any], status: Mapping[str, Any]) -> int:
        """The batch size to plan for: fixed, or the automatic range's target/current/min."""
        if "autoBatch" not in spec:
            return initial_batch(spec)
        auto = spec["autoBatch"]
        seen = status.get("batchSize") or {}
        batch = seen.get("target") or seen.get("current") or auto["min"]
        return max(int(auto["min"]), min(int(auto["max"]), int(batch)))

    def _observe_batch(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        optimizer: Optimizer,
        profile: Profile,
        now: datetime.datetime,
    ) -> None:
        """autoBatch: record the pods' combined estimate, decide (``plan.reconfig``), maybe
        set a new target; the next pass switches to it through the active-passive switch."""
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        policy = ab.policy_from_spec(obj["spec"]["autoBatch"])
        annotations = meta.get("annotations") or {}
        seen = dict(status.get("batchSize") or {})
        pinned, pin_error = ab.parse_pin(annotations)
        trigger = ab.pending_trigger(annotations, seen)
        reading = ab.as_reading(self.estimates(namespace, name)) if self.estimates else None
        stamp = now_iso(now)
        if reading is not None and reading.combined is not None:
            seen = ab.record_observation(seen, reading=reading, policy=policy, now=stamp)
            result.observed_batch = seen["observed"]
        elif pinned is None and trigger is None:
            return  # nothing new to decide on
        last: dict[str, Any] = status.get("lastSwitch") or {}
        last_at = parse_time(last.get("time"))
        if (
            pinned is not None
            and last.get("result") == "Aborted"
            and last_at is not None
            and (now - last_at).total_seconds() < policy.min_interval_s
        ):
            pinned = None  # a pinned switch that aborted is retried after minIntervalSeconds
        current_plan = Plan.from_dict(wire_plan(status.get("plan") or {}))
        decision = decide(
            policy=policy,
            current_plan=current_plan,
            table=profile.table(),
            optimal_latency=optimizer.latency,
            history=ab.observations(seen),
            last_switch_at=last_at.timestamp() if last_at else None,
            now=now.timestamp(),
            pinned=pinned,
            ignore_interval=trigger is not None,
        )
        previous = (seen.get("lastDecision") or {}).get("outcome")
        seen["lastDecision"] = ab.decision_status(decision, now=stamp, trigger=trigger)
        if pin_error:
            seen["lastDecision"]["message"] += f" ({pin_error})"
        if trigger is not None:
            seen["reconfigureHandled"] = trigger
        result.decision = decision.outcome.value
        if decision.switch and decision.target is not None:
            seen["target"] = decision.target
            self._emit(result, "Normal", "BatchSizeChanged", decision.message)
        elif previous != decision.outcome.value and pin_error:
            self._emit(result, "Warning", "BadAnnotation", pin_error)
        status["batchSize"] = seen

    # -- profiling -------------------------------------------------------------------------
    def _profile(
        self,
        obj: dict[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        image: str,
        now: datetime.datetime,
    ) -> Profile | None:
        meta = obj["metadata"]
        name, namespace = meta["name"], meta.get("namespace", "default")
        spec = obj["spec"]
        key = profile_key(spec, image=image)
        obj_name = m.profile_object_name(name, key)
        pstatus = dict(status.get("profile") or {})
        if pstatus.get("key") != key:
            pstatus = {"key": key}
        cm = self.kube.get("configmaps", namespace, obj_name)
        if cm is not None:
            text = (cm.get("data") or {}).get(m.PROFILE_FILE, "")
            try:
                profile = parse_profile(text, origin=f"configmap {namespace}/{obj_name}")
            except ProfileError as exc:
                logger.warning("discarding unreadable profile %s: %s", obj_name, exc)
                self.kube.delete("configmaps", namespace, obj_name)
                return None
            pstatus.update(
                configMap=obj_name,
                digest=hashlib.sha256(text.encode()).hexdigest(),
                cpuModel=profile.meta.cpu_model,
            )
            for stale in ("job", "retryAt", "lastFailure", "attempts"):
                pstatus.pop(stale, None)
            status["profile"] = pstatus
            if profile.meta.cpus and profile.meta.cpus < int(spec["cpus"]):
                logger.warning("profile %s measured on %s cpus", obj_name, profile.meta.cpus)
            self._cond(
                status,
                obj,
                "Profiled",
                True,
                "Profiled",
                f"profile in configmap {obj_name}",
                now=now,
            )
            return profile

        job = self.kube.get("jobs", namespace, obj_name)
        attempts = int(pstatus.get("attempts") or 0)
        generation = meta.get("generation")
        failed_generation = pstatus.get("failedGeneration")
        if failed_generation is not None and generation != failed_generation:
            # the user changed the spec after giving up: try again from scratch
            for stale in ("attempts", "failedGeneration", "retryAt"):
                pstatus.pop(stale, None)
            attempts = 0
        if job is None:
            if attempts >= self.config.max_profile_attempts:
                if generation is not None:
                    pstatus["failedGeneration"] = generation
                result.phase = "Failed"
                result.result = "profiling_failed"
                message = (
                    f"profiling failed {attempts} times; last: {pstatus.get('lastFailure', '?')}"
                )
                status["message"] = message
                status["profile"] = pstatus
                self._cond(status, obj, "Profiled", False, "ProfilingFailed", message, now=now)
                self._cond(status, obj, "Ready", False, "ProfilingFailed", message, now=now)
                return None
            retry_at = parse_time(pstatus.get("retryAt"))
            if retry_at is not None and now < retry_at:
                result.phase = "Profiling"
                result.result = "waiting"
                status["profile"] = pstatus
                return None
            created = self.kube.create(
                "jobs", namespace, m.profiling_job(obj, key=key, image=image)
            )
            pstatus.update(job=obj_name, startedAt=now_iso(now))
            pstatus.pop("retryAt", None)
            status["profile"] = pstatus
            result.phase = "Profiling"
            message = f"profiling job {obj_name} started (attempt {attempts + 1})"
            status["message"] = message
            if created:
                self._emit(result, "Normal", "ProfilingStarted", message)
            self._cond(status, obj, "Profiled", False, "Profiling", message, now=now)
            return None

        state = _job_state(job)
        status.pop("profiling", None)  # progress is shown while the Job runs, below
        failure: str | None = None
        # only this Job's pods: a deleted predecessor of the same name may leave pods behind
        # until the garbage collector removes them
        job_uid = job["metadata"].get("uid")
        pods = [
            p
            for p in self.kube.list("pods", namespace, labels={"job-name": obj_name})
            if job_uid is None
            or any(r.get("uid") == job_uid for r in p["metadata"].get("ownerReferences") or [])
        ]
        if state == "succeeded":
            text = None
            for pod in pods:
                if (pod.get("status") or {}).get("phase") == "Succeeded":
                    text = self.kube.read_log(
                        namespace, pod["metadata"]["name"], container="publish"
                    )
                    if text:
                        break
            finished = parse_time((job.get("status") or {}).get("completionTime"))
            if not text and (finished is None or (now - finished).total_seconds() < 60):
                # the pod's status or log may lag the Job's condition: look again shortly
                result.phase = "Profiling"
                status["profile"] = pstatus
                return None
            try:
                if not text:
                    raise ProfileError("the profiling pod's log is empty or gone")
                profile = parse_profile(text, origin=f"job {namespace}/{obj_name}")
            except ProfileError as exc:
                state = "failed"
                failure = f"profile unreadable: {exc}"
            else:
                cm_body = m.profile_configmap(
                    obj, key=key, profile_json=profile.to_json(), cpu_model=profile.meta.cpu_model
                )
                self.kube.create("configmaps", namespace, cm_body)
                self.kube.delete("jobs", namespace, obj_name)
                for pod in pods:  # don't wait for the garbage collector: the retry reuses the name
                    self.kube.delete("pods", namespace, pod["metadata"]["name"])
                started = (job.get("status") or {}).get("startTime") or pstatus.get("startedAt")
                result.profiling_seconds = _seconds_since(started, now)
                self._emit(
                    result,
                    "Normal",
                    "Profiled",
                    f"profile stored in configmap {obj_name} "
                    f"({len(profile.points)} points, cpu {profile.meta.cpu_model})",
                )
                pstatus.pop("job", None)
                status["profile"] = pstatus
                return self._profile(obj, status, result, image=image, now=now)
        if state == "failed":
            if failure is None:
                reasons = [r for r in (pod_failure(p) for p in pods) if r]
                job_reason = next(
                    (
                        f"{c.get('reason', '')}: {c.get('message', '')}"
                        for c in (job.get("status") or {}).get("conditions") or []
                        if c.get("type") == "Failed"
                    ),
                    "job failed",
                )
                failure = reasons[-1] if reasons else job_reason
            attempts += 1
            delay = min(
                self.config.profile_retry_seconds * 2 ** (attempts - 1),
                self.config.profile_retry_max_seconds,
            )
            self.kube.delete("jobs", namespace, obj_name)
            for pod in pods:  # don't wait for the garbage collector: the retry reuses the name
                self.kube.delete("pods", namespace, pod["metadata"]["name"])
            pstatus.update(
                attempts=attempts,
                lastFailure=failure[:1000],
                retryAt=now_iso(now + datetime.timedelta(seconds=delay)),
            )
            pstatus.pop("job", None)
            status["profile"] = pstatus
            result.result = "profiling_failed"
            final = attempts >= self.config.max_profile_attempts
            message = f"profiling attempt {attempts} failed: {failure}" + (
                "" if final else f"; retrying in {delay:.0f}s"
            )
            status["message"] = message[:2000]
            self._emit(result, "Warning", "ProfilingFailed", message[:1000])
            self._cond(
                status,
                obj,
                "Profiled",
                False,
                "ProfilingFailed" if final else "ProfilingRetry",
                message[:2000],
                now=now,
            )
            result.phase = "Failed" if final else "Profiling"
            return None

        # still running: surface stuck pods (image pull errors and the like)
        result.phase = "Profiling"
        result.profiling_progress = self._profiling_progress(namespace, pods)
        if result.profiling_progress is not None:
            status["profiling"] = {"progress": result.profiling_progress}
        stuck = [r for r in (pod_failure(p) for p in pods) if r]
        message = f"profiling job {obj_name} running" + (f": {stuck[-1]}" if stuck else "")
        status["message"] = message
        self._cond(
            status,
            obj,
            "Profiled",
            False,
            "ProfilingStuck" if stuck else "Profiling",
            message,
            now=now,
        )
        status["profile"] = pstatus
        return None

    def _profiling_progress(
        self, namespace: str, pods: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The running profiler's last progress line (points done, total, ETA), if any."""
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                try:
                    log = self.kube.read_log(
                        namespace, pod["metadata"]["name"], container="profile"
                    )
                except Exception:  # progress is informational: never fail the pass for it
                    logger.debug("no profiling log from %s", pod["metadata"]["name"], exc_info=True)
                    continue
                progress = parse_progress(log)
                if progress is not None:
                    return progress
        return None

    # -- serving ---------------------------------------------------------------------------
    def _ensure_deployment(
        self,
        obj: Mapping[str, Any],
        *,
        slot: str,
        plan: Mapping[str, Any],
        desired_hash: str,
        replicas: int,
    ) -> dict[str, Any] | None:
        """Create the slot's Deployment or bring its template and replicas to the wanted ones."""
        meta = obj["metadata"]
        namespace = meta.get("namespace", "default")
        body = m.serving_deployment(
            obj,
            slot=slot,
            plan=plan,
            serving_hash=desired_hash,
            replicas=replicas,
            image=self.config.image,
        )
        dep_name = body["metadata"]["name"]
        dep = self.kube.get("deployments", namespace, dep_name)
        if dep is None:
            self.kube.create("deployments", namespace, body)
            return self.kube.get("deployments", namespace, dep_name)
        current_hash = (dep.get("metadata", {}).get("labels") or {}).get(m.LABEL_SERVING_HASH)
        patch: dict[str, Any] = {}
        if current_hash != desired_hash:
            patch = {
                "metadata": {
                    "labels": body["metadata"]["labels"],
                    "annotations": body["metadata"]["annotations"],
                },
                "spec": {"template": body["spec"]["template"], "replicas": replicas},
            }
        elif int((dep.get("spec") or {}).get("replicas", 0)) != replicas:
            patch = {"spec": {"replicas": replicas}}
        if patch:
            return self.kube.patch("deployments", namespace, dep_name, patch)
        return dep

    def _scale(self, namespace: str, dep_name: str, replicas: int) -> None:
        dep = self.kube.get("deployments", namespace, dep_name)
        if dep is not None and int((dep.get("spec") or {}).get("replicas", 0)) != replicas:
            self.kube.patch("deployments", namespace, dep_name, {"spec": {"replicas": replicas}})

    def _set_selector(self, namespace: str, name: str, slot: str) -> None:
        svc = self.kube.get("services", namespace, name)
        want = m.service_selector(name, slot=slot)
        if svc is not None and (svc.get("spec") or {}).get("selector") != want:
            self.kube.patch("services", namespace, name, {"spec": {"selector": want}})

    def _first_deploy(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        plan: dict[str, Any],
        desired_hash: str,
        now: datetime.datetime,
    ) -> None:
        name = obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", "default")
        replicas = int(obj["spec"]["replicas"])
        self._ensure_deployment(
            obj, slot="a", plan=plan, desired_hash=desired_hash, replicas=replicas
        )
        self._set_selector(namespace, name, "a")
        status.update(activeSlot="a", servingHash=desired_hash, plan=status_plan(plan))
        status["batchSize"] = {**(status.get("batchSize") or {}), "current": plan["batch"]}
        self._emit(result, "Normal", "Deploying", f"slot a deploying plan {plan['label']}")
        self._steady(obj, status, result, replicas=replicas, now=now)

    def _steady(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        replicas: int,
        now: datetime.datetime,
    ) -> None:
        name = obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", "default")
        slot = str(status["activeSlot"])
        plan = wire_plan(status.get("plan") or {})
        dep = self._ensure_deployment(
            obj,
            slot=slot,
            plan=plan,
            desired_hash=str(status.get("servingHash")),
            replicas=replicas,
        )
        self._set_selector(namespace, name, slot)
        ready_replicas = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
        status["readyReplicas"] = ready_replicas
        ready = deployment_ready(dep, replicas)
        was_ready = status.get("phase") == "Ready"
        result.phase = derive_phase(
            Facts(
                profiled=True,
                planned=True,
                deployed=True,
                ready_replicas=ready_replicas if ready else min(ready_replicas, replicas - 1),
                replicas=replicas,
            )
        )
        if result.phase == "Ready":
            message = (
                f"serving plan {plan.get('label')} on slot {slot}, "
                f"{ready_replicas}/{replicas} ready"
            )
            if not was_ready:
                self._emit(result, "Normal", "Ready", message)
            self._cond(status, obj, "Ready", True, "Ready", message, now=now)
            self._cond(status, obj, "Degraded", False, "AllReplicasReady", "", now=now)
        else:
            message = f"slot {slot}: {ready_replicas}/{replicas} replicas ready"
            self._cond(status, obj, "Ready", False, "ReplicasNotReady", message, now=now)
            if was_ready:
                self._cond(status, obj, "Degraded", True, "ReplicasNotReady", message, now=now)
        status["message"] = message
        if "switch" not in status and not any(
            c.get("type") == "Reconfiguring" for c in status.get("conditions") or []
        ):
            self._cond(status, obj, "Reconfiguring", False, "Stable", "", now=now)

    # -- switching -------------------------------------------------------------------------
    def _start_switch(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        plan: dict[str, Any],
        desired_hash: str,
        now: datetime.datetime,
    ) -> None:
        active = str(status["activeSlot"])
        target = m.other_slot(active)
        old_plan = status.get("plan") or {}
        reason = f"plan {old_plan.get('label')} -> {plan['label']}"
        if old_plan.get("batch") != plan["batch"]:
            reason += f" (batch {old_plan.get('batch')} -> {plan['batch']})"
        replicas = int(obj["spec"]["replicas"])
        self._ensure_deployment(
            obj, slot=target, plan=plan, desired_hash=desired_hash, replicas=replicas
        )
        status["switch"] = {
            "stage": "rollout",
            "fromSlot": active,
            "targetSlot": target,
            "hash": desired_hash,
            "plan": status_plan(plan),
            "reason": reason,
            "startedAt": now_iso(now),
        }
        status["batchSize"] = {
            **(status.get("batchSize") or {}),
            "current": old_plan.get("batch"),
            "target": plan["batch"],
        }
        message = f"switching to slot {target}: {reason}"
        status["message"] = message
        self._emit(result, "Normal", "SwitchStarted", message)
        self._cond(status, obj, "Reconfiguring", True, "SwitchStarted", message, now=now)
        result.phase = "Reconfiguring"

    def _advance_switch(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        now: datetime.datetime,
    ) -> None:
        name = obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", "default")
        spec = obj["spec"]
        switch = dict(status["switch"])
        replicas = int(spec["replicas"])
        target, source = switch["targetSlot"], switch["fromSlot"]
        result.phase = "Reconfiguring"
        elapsed = _seconds_since(switch.get("startedAt"), now)
        if switch["stage"] == "rollout":
            dep = self._ensure_deployment(
                obj,
                slot=target,
                plan=wire_plan(switch["plan"]),
                desired_hash=switch["hash"],
                replicas=replicas,
            )
            # keep the active slot at the wanted size while the new one comes up
            self._scale(namespace, m.deployment_name(name, source), replicas)
            if deployment_ready(dep, replicas):
                switch["readySeconds"] = round(elapsed, 3)
                self._set_selector(namespace, name, target)
                switch["switchedSeconds"] = round(_seconds_since(switch["startedAt"], _now()), 3)
                drain = float(spec["switch"]["drainSeconds"])
                switch["stage"] = "draining"
                switch["drainUntil"] = now_iso(now + datetime.timedelta(seconds=drain))
                status["switch"] = switch
                status.update(
                    activeSlot=target,
                    servingHash=switch["hash"],
                    plan=switch["plan"],
                )
                message = f"service moved to slot {target}; draining slot {source} for {drain:.0f}s"
                status["message"] = message
                self._emit(result, "Normal", "ServiceSwitched", message)
                self._cond(status, obj, "Reconfiguring", True, "Draining", message, now=now)
                return
            timeout = float(spec["switch"]["readyTimeoutSeconds"])
            if elapsed > timeout:
                self._abort(
                    obj,
                    status,
                    result,
                    reason=f"slot {target} not ready within {timeout:.0f}s",
                    now=now,
                )
                self._steady(obj, status, result, replicas=replicas, now=now)
                return
            ready = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
            status["message"] = (
                f"switching to slot {target}: {ready}/{replicas} ready after {elapsed:.0f}s"
            )
            status["switch"] = switch
            return
        # draining: the Service already selects the target; wait, then retire the old slot
        drain_until = parse_time(switch.get("drainUntil"))
        if drain_until is not None and now < drain_until:
            self._set_selector(namespace, name, target)
            return
        self._scale(namespace, m.deployment_name(name, source), 0)
        timeline = {
            "passiveReadySeconds": float(switch.get("readySeconds", 0.0)),
            "selectorSwitchSeconds": float(switch.get("switchedSeconds", 0.0)),
            "oldSlotScaledDownSeconds": round(elapsed, 3),
        }
        status["lastSwitch"] = {
            "time": now_iso(now),
            "reason": switch.get("reason", ""),
            "result": "Succeeded",
            "fromSlot": source,
            "toSlot": target,
            "plan": str(switch["plan"].get("label", "")),
            "timeline": timeline,
        }
        status.pop("switch", None)
        before = (status.get("batchSize") or {}).get("current")
        status["batchSize"] = {
            **(status.get("batchSize") or {}),
            "current": switch["plan"].get("batch"),
        }
        status["batchSize"].pop("target", None)
        status["switchHistory"] = ab.append_history(
            status.get("switchHistory"),
            {
                **{k: v for k, v in status["lastSwitch"].items() if k != "timeline"},
                "fromBatch": before,
                "toBatch": switch["plan"].get("batch"),
                "seconds": timeline["selectorSwitchSeconds"],
            },
        )
        result.switch_result = "succeeded"
        result.switch_seconds = timeline["selectorSwitchSeconds"]
        message = f"switch to slot {target} done ({switch.get('reason', '')})"
        self._emit(result, "Normal", "SwitchCompleted", message)
        self._cond(status, obj, "Reconfiguring", False, "SwitchCompleted", message, now=now)
        self._steady(obj, status, result, replicas=replicas, now=now)

    def _abort(
        self,
        obj: Mapping[str, Any],
        status: dict[str, Any],
        result: Result,
        *,
        reason: str,
        now: datetime.datetime,
    ) -> None:
        name = obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", "default")
        switch = dict(status.get("switch") or {})
        target = switch.get("targetSlot", m.other_slot(str(status.get("activeSlot"))))
        self._scale(namespace, m.deployment_name(name, target), 0)
        self._set_selector(namespace, name, str(status["activeSlot"]))
        status["switch"] = {
            "stage": "aborted",
            "hash": switch.get("hash"),
            "targetSlot": target,
            "reason": reason,
        }
        status["lastSwitch"] = {
            "time": now_iso(now),
            "reason": f"{switch.get('reason', '')}: {reason}",
            "result": "Aborted",
            "fromSlot": str(status["activeSlot"]),
            "toSlot": target,
            "plan": str((switch.get("plan") or {}).get("label", "")),
        }
        result.switch_result = "aborted"
        status["switchHistory"] = ab.append_history(
            status.get("switchHistory"),
            {
                **status["lastSwitch"],
                "fromBatch": (status.get("batchSize") or {}).get("current"),
                "toBatch": (switch.get("plan") or {}).get("batch"),
            },
        )
        status["batchSize"] = {
            k: v for k, v in (status.get("batchSize") or {}).items() if k != "target"
        }
        message = f"switch aborted ({reason}); still serving slot {status['activeSlot']}"
        self._emit(result, "Warning", "SwitchAborted", message)
        self._cond(status, obj, "Reconfiguring", False, "SwitchAborted", message, now=now)
