"""The profile: reuse the ConfigMap for the current key, or run one profiling Job.

At most one profiling Job per model exists: any other Job of this model (superseded by a
spec change) is deleted first. A pod's trouble (unschedulable, image pull, OOMKilled, exit
code, last log lines) is copied into the condition and an event as soon as it shows; a pod
the scheduler cannot place fails its attempt after ``unschedulable_grace_seconds``.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from packrat.controller.api.backoff import backoff
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.pods import job_state, pod_failure, unschedulable
from packrat.controller.core.status import ProfileRecord, now_iso, parse_time
from packrat.controller.profiling import manifests as pm
from packrat.controller.profiling.isolation import CONDITION as ISOLATION_CONDITION
from packrat.controller.profiling.isolation import cores_exclusive
from packrat.controller.profiling.progress import parse_progress
from packrat.controller.serving import manifests as m
from packrat.plan.profile import Profile, ProfileError, parse_profile

logger = logging.getLogger(__name__)

MAX_PROFILE_BYTES = 4 * 1024 * 1024


def _parse(text: str, *, origin: str) -> Profile:
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{origin}: profile larger than {MAX_PROFILE_BYTES} bytes")
    try:
        return parse_profile(text, origin=origin)
    except (RecursionError, TypeError, ValueError, KeyError, AttributeError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"{origin}: unreadable profile ({type(exc).__name__})") from None


def _ours(p: Pass, obj: Mapping[str, Any]) -> bool:
    return owned_by(obj, name=p.name, uid=p.obj["metadata"].get("uid"))


def drop_superseded(p: Pass, jobs: Sequence[Mapping[str, Any]], *, keep: str | None) -> None:
    """Delete every profiling Job of this model but ``keep`` (with its pods)."""
    for job in jobs:
        job_name = job["metadata"]["name"]
        if job_name == keep or not _ours(p, job):
            continue
        p.kube.delete("jobs", p.namespace, job_name)
        p.emit("Normal", "ProfilingSuperseded", f"profiling job {job_name} deleted: superseded")


def ensure_profile(
    p: Pass,
    model: ModelSpec,
    *,
    configmap: Mapping[str, Any] | None,
    jobs: Sequence[Mapping[str, Any]],
) -> Profile | None:
    """The profile for the model's current key, or None while it is being measured."""
    status = p.status
    key = model.profile_key
    obj_name = m.profile_object_name(model.name, key)
    pstatus = status.profile.for_key(key)
    if configmap is not None and not _ours(p, configmap):
        p.conflict("ConfigMap", obj_name)
        configmap = None
        drop_superseded(p, jobs, keep=None)
        status.set_profile(pstatus)
        status.failed()
        p.result.result = "conflict"
        return None
    if configmap is not None:
        text = (configmap.get("data") or {}).get(m.PROFILE_FILE, "")
        try:
            profile = _parse(text, origin=f"configmap {model.namespace}/{obj_name}")
        except ProfileError as exc:
            logger.warning("discarding unreadable profile %s: %s", obj_name, exc)
            p.kube.delete("configmaps", model.namespace, obj_name)
            p.result.in_progress()
            return None
        drop_superseded(p, jobs, keep=None)
        pstatus = pstatus.stored(
            config_map=obj_name,
            digest=hashlib.sha256(text.encode()).hexdigest(),
            cpu_model=profile.meta.cpu_model,
            mode=profile.meta.mode,
        )
        status.set_profile(pstatus)
        p.cond("Profiled", True, "Profiled", f"profile in configmap {obj_name}")
        exclusive, reason, message = cores_exclusive(profile)
        if exclusive is not None:
            p.cond(ISOLATION_CONDITION, exclusive, reason, message[:2000])
            p.result.cores_exclusive = exclusive
        return profile

    drop_superseded(p, jobs, keep=obj_name)
    job = next((j for j in jobs if j["metadata"]["name"] == obj_name and _ours(p, j)), None)
    if job is None and any(j["metadata"]["name"] == obj_name for j in jobs):
        p.conflict("Job", obj_name)
        status.set_profile(pstatus)
        status.failed()
        p.result.result = "conflict"
        return None
    status.set_profile(pstatus)
    if job is None:
        return _start_job(p, model, pstatus, obj_name=obj_name, key=key)
    return _follow_job(p, model, pstatus, job=job, obj_name=obj_name)


def _start_job(
    p: Pass, model: ModelSpec, pstatus: ProfileRecord, *, obj_name: str, key: str
) -> Profile | None:
    status = p.status
    failed_generation = pstatus.failed_generation
    if failed_generation is not None and model.generation != failed_generation:
        # the user changed the spec after giving up: try again from scratch
        pstatus = pstatus.fresh_start()
        status.set_profile(pstatus)
    attempts = pstatus.attempts
    if attempts >= p.config.max_profile_attempts:
        if model.generation is not None:
            pstatus = pstatus.gave_up(model.generation)
        status.set_profile(pstatus)
        status.failed()
        p.result.result = "profiling_failed"
        last = pstatus.last_failure if pstatus.last_failure is not None else "?"
        message = f"profiling failed {attempts} times; last: {last}"
        status.set_message(message)
        p.cond("Profiled", False, "ProfilingFailed", message)
        p.cond("Ready", False, "ProfilingFailed", message)
        return None
    status.profiling()
    p.result.in_progress()
    retry_at = parse_time(pstatus.retry_at)
    if retry_at is not None and p.now < retry_at:
        p.result.result = "waiting"
        return None
    created = p.kube.create(
        "jobs", model.namespace, pm.profiling_job(model, limits=p.config.storage)
    )
    status.set_profile(pstatus.started(job=obj_name, started_at=now_iso(p.now)))
    message = f"profiling job {obj_name} started (attempt {attempts + 1})"
    status.set_message(message)
    if created:
        p.emit("Normal", "ProfilingStarted", message)
    p.cond("Profiled", False, "Profiling", message)
    return None


def _job_pods(p: Pass, job: Mapping[str, Any], obj_name: str) -> list[dict[str, Any]]:
    # only this Job's pods: a deleted predecessor of the same name may leave pods behind
    job_uid = job["metadata"].get("uid")
    return [
        pod
        for pod in p.kube.list("pods", p.namespace, labels={"job-name": obj_name})
        if job_uid is None
        or any(r.get("uid") == job_uid for r in pod["metadata"].get("ownerReferences") or [])
    ]


def _follow_job(
    p: Pass, model: ModelSpec, pstatus: ProfileRecord, *, job: Mapping[str, Any], obj_name: str
) -> Profile | None:
    status = p.status
    status.profiling()
    p.result.in_progress()
    state = job_state(job)
    pods = _job_pods(p, job, obj_name)
    status.set_profiling_progress(None)  # progress is shown while the Job runs, below
    failure: str | None = None
    if state == "succeeded":
        text = _published(p, pods)
        finished = parse_time((job.get("status") or {}).get("completionTime"))
        if not text and (finished is None or (p.now - finished).total_seconds() < 60):
            return None  # the pod's status or log may lag the Job's condition
        try:
            if not text:
                raise ProfileError("the profiling pod's log is empty or gone")
            profile = _parse(text, origin=f"job {p.namespace}/{obj_name}")
        except ProfileError as exc:
            state = "failed"
            failure = f"profile unreadable: {exc}"
        else:
            return _store(p, model, pstatus, profile, job=job, obj_name=obj_name, pods=pods)
    if state != "failed":
        stuck = _stuck(p, pods)
        if stuck is None or stuck[1] is None:
            _show_running(p, pstatus, obj_name=obj_name, pods=pods, stuck=stuck)
            return None
        failure = stuck[1]
    if failure is None:
        failure = _job_failure(job, pods)
    _failed_attempt(p, pstatus, failure=failure, obj_name=obj_name, pods=pods)
    return None


def _published(p: Pass, pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The profile JSON a succeeded pod's ``publish`` container printed (None: no log yet)."""
    text = None
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            text = p.kube.read_log(p.namespace, pod["metadata"]["name"], container="publish")
            if text:
                break
    return text


def _store(
    p: Pass,
    model: ModelSpec,
    pstatus: ProfileRecord,
    profile: Profile,
    *,
    job: Mapping[str, Any],
    obj_name: str,
    pods: Sequence[Mapping[str, Any]],
) -> Profile | None:
    """Keep a finished profile in its ConfigMap, delete the Job, say so (and warn when its
    cores were not exclusive); then read it back as any stored profile is."""
    cm_body = pm.profile_configmap(
        model, profile_json=profile.to_json(), cpu_model=profile.meta.cpu_model
    )
    p.kube.create("configmaps", p.namespace, cm_body)
    _delete_job(p, obj_name, pods)
    started = (job.get("status") or {}).get("startTime") or pstatus.started_at
    p.result.profiling_seconds = p.seconds_since(started)
    p.emit(
        "Normal",
        "Profiled",
        f"profile stored in configmap {obj_name} "
        f"({len(profile.points)} points, cpu {profile.meta.cpu_model})",
    )
    exclusive, reason, message = cores_exclusive(profile)
    if exclusive is False:
        p.emit("Warning", reason, f"profiling pod: {message}"[:1000])
    return ensure_profile(p, model, configmap=cm_body, jobs=[])


def _show_running(
    p: Pass,
    pstatus: ProfileRecord,
    *,
    obj_name: str,
    pods: Sequence[Mapping[str, Any]],
    stuck: tuple[str, str | None] | None,
) -> None:
    """The running Job's progress and message; a pod newly stuck (not failed yet) is a
    ProfilingStuck warning, once."""
    status = p.status
    p.result.profiling_progress = _progress(p, pods)
    status.set_profiling_progress(p.result.profiling_progress)
    message = f"profiling job {obj_name} running" + (f": {stuck[0]}" if stuck else "")
    if stuck and pstatus.stuck != stuck[0]:
        p.emit("Warning", "ProfilingStuck", message[:1000])
        status.set_profile(pstatus.stuck_on(stuck[0]))
    status.set_message(message[:2000])
    p.cond("Profiled", False, "ProfilingStuck" if stuck else "Profiling", message[:2000])


def _job_failure(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """Why a failed Job failed: its last pod's failure, else the Job's Failed condition."""
    reasons = [r for r in (pod_failure(pod) for pod in pods) if r]
    job_reason = next(
        (
            f"{c.get('reason', '')}: {c.get('message', '')}"
            for c in (job.get("status") or {}).get("conditions") or []
            if c.get("type") == "Failed"
        ),
        "job failed",
    )
    return reasons[-1] if reasons else job_reason


def _progress(p: Pass, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The running profiler's last progress line (points done, total, ETA), if any."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
            continue
        try:
            log = p.kube.read_log(p.namespace, pod["metadata"]["name"], container="profile")
        except Exception:  # progress is informational: never fail the pass for it
            logger.debug("no profiling log from %s", pod["metadata"]["name"], exc_info=True)
            continue
        progress = parse_progress(log)
        if progress is not None:
            return progress
    return None


def _stuck(p: Pass, pods: Sequence[Mapping[str, Any]]) -> tuple[str, str | None] | None:
    """(why a pod is stuck, the failure when it has been stuck too long) or None."""
    for pod in pods:
        reason = pod_failure(pod)
        if reason:
            return reason, None
        waiting = unschedulable(pod)
        if waiting is not None:
            message, since = waiting
            text = f"pod {pod['metadata']['name']} unschedulable: {message}"
            start = since or pod["metadata"].get("creationTimestamp")
            grace = p.config.unschedulable_grace_seconds
            if p.seconds_since(start) >= grace:
                return text, f"{text} (for more than {grace:.0f}s)"
            return text, None
    return None


def _delete_job(p: Pass, obj_name: str, pods: Sequence[Mapping[str, Any]]) -> None:
    p.kube.delete("jobs", p.namespace, obj_name)
    for pod in pods:  # don't wait for the garbage collector: the retry reuses the name
        p.kube.delete("pods", p.namespace, pod["metadata"]["name"])


def _failed_attempt(
    p: Pass,
    pstatus: ProfileRecord,
    *,
    failure: str,
    obj_name: str,
    pods: Sequence[Mapping[str, Any]],
) -> None:
    status = p.status
    attempts = pstatus.attempts + 1
    delay = backoff(
        attempts,
        base=p.config.profile_retry_seconds,
        cap=p.config.profile_retry_max_seconds,
        seed=f"{p.namespace}/{p.name}/profile",
    )
    _delete_job(p, obj_name, pods)
    retry_at = now_iso(p.now + datetime.timedelta(seconds=delay))
    status.set_profile(pstatus.failed_attempt(failure=failure[:1000], retry_at=retry_at))
    p.result.result = "profiling_failed"
    final = attempts >= p.config.max_profile_attempts
    message = f"profiling attempt {attempts} failed: {failure}" + (
        "" if final else f"; retrying in {delay:.0f}s"
    )
    status.set_message(message[:2000])
    p.emit("Warning", "ProfilingFailed", message[:1000])
    p.cond("Profiled", False, "ProfilingFailed" if final else "ProfilingRetry", message[:2000])
    if final:
        status.failed()
    else:
        status.profiling()
