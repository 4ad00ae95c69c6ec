"""Profiling progress from the profiling pod's log (pure).

``packrat profile`` prints one line per measured point to its log (``packrat.profiler.progress``):

    profile resnet50 [######..................] 6/24 elapsed 1:02 ETA 3:05  t=2 b=8 ...

While the Job runs the operator reads that log and shows the last such line as
``status.profiling.progress`` (points done, total, ETA), so a 10-30 minute run is not a black
box, and exports it as ``packrat_model_profiling_points_done`` / ``_points`` / ``_eta_seconds``.
"""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(
    r"\]\s+(?P<done>\d+)/(?P<total>\d+)\s+elapsed\s+(?P<elapsed>[\d:?]+)\s+ETA\s+(?P<eta>[\d:?]+)"
)


def parse_duration(text: str) -> int | None:
    """Seconds of ``m:ss`` or ``h:mm:ss`` (``format_duration``'s output); None for ``?``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds


def parse_progress(log: str | None) -> dict[str, Any] | None:
    """The last progress line of a profiling log as ``{done, total, etaSeconds,
    elapsedSeconds}`` (camelCase, as in status), or None when there is none yet."""
    if not log:
        return None
    # a terminal redraws in place with carriage returns; a pod's log has one line per point
    for line in reversed(re.split(r"[\r\n]+", log)):
        match = _LINE.search(line)
        if match is None:
            continue
        done, total = int(match["done"]), int(match["total"])
        if total <= 0 or done > total:
            continue
        return {
            "done": done,
            "total": total,
            "etaSeconds": parse_duration(match["eta"]),
            "elapsedSeconds": parse_duration(match["elapsed"]),
        }
    return None
