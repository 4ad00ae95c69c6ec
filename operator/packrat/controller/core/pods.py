"""Reading pods and Jobs: why a pod failed or is stuck, and where a Job stands (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_STUCK_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
)


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
            if waiting and waiting.get("reason") in _STUCK_WAITING:
                return (
                    f"container {cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}"
                )
    if status.get("phase") == "Failed":
        return f"pod failed: {status.get('reason', '')} {status.get('message', '')}".strip()
    return None


def unschedulable(pod: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(the scheduler's reason and message, since when) for a pod it cannot place."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            message = (cond.get("message") or "").strip()
            return (f"{reason}: {message}" if message else reason), cond.get("lastTransitionTime")
    return None


def job_state(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    if int(status.get("succeeded") or 0) > 0:
        return "succeeded"
    return "running"
