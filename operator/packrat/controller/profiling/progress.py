"""Profiling progress from the profiling pod's log, as data (pure).

``packrat profile`` prints, after each measured point's human-readable bar line, one
``packrat-progress {...}`` line (:class:`packrat.plan.profile.ProgressRecord`: points done,
total, seconds elapsed and left). While the Job runs the operator reads the pod's log and
shows the last such record as ``status.profiling.progress`` (points done, total, ETA), so a
10-30 minute run is not a black box, and exports it as
``packrat_model_profiling_points_done`` / ``_points`` / ``_eta_seconds``. The log is the
pod's: each record is validated (bounded integers, ``done <= total``) and anything else is
no progress.
"""

from __future__ import annotations

from typing import Any

from packrat.plan.profile import progress_from_line


def parse_progress(log: str | None) -> dict[str, Any] | None:
    """The last progress record of a profiling log as ``{done, total, etaSeconds,
    elapsedSeconds}`` (camelCase, as in status), or None when there is none yet."""
    if not log:
        return None
    for line in reversed(log.splitlines()):
        record = progress_from_line(line.strip())
        if record is not None:
            return record.to_status()
    return None
