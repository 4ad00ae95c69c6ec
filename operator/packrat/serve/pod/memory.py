"""The serving pod's memory watchdog: a leaking worker is restarted before the container is
OOM-killed.

A ``.mar`` handler is the model author's code; one that leaks grows its worker until the
kernel kills the container, and the container holds the dispatcher and every other instance:
one leak, the whole pod down, its queued requests lost (issue 38: leaking handlers had no
limit). The monitor (:mod:`packrat.serve.pod.health`) calls :func:`reclaim` every check: when
the private memory of the pod's processes (their anonymous resident pages, ``RssAnon``: what a
leak grows; mapped weights are file pages and shared) passes ``fraction`` of the container's
memory limit (cgroup v2 ``memory.max``), the largest worker is killed. Its runtime restarts it
(the native runtime at once, TorchServe as it restarts any worker), the pod warms the new one,
and only that instance's in-flight requests fail (503, retried elsewhere by the client).
Without a memory limit (``max``, or no cgroup) there is nothing to protect and nothing is done.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

__all__ = ["FRACTION", "container_memory_limit", "reclaim", "rss_anon", "to_reclaim"]

log = logging.getLogger(__name__)

FRACTION = 0.85  # of the container's limit: past it, the largest worker goes


def rss_anon(pid: int) -> int:
    """The process's anonymous resident bytes (``RssAnon``); 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def container_memory_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This container's memory limit in bytes (cgroup v2 ``memory.max``), None when none."""
    try:
        text = (root / "memory.max").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def to_reclaim(
    workers: Mapping[str, int], *, own: int, limit: int, fraction: float = FRACTION
) -> str | None:
    """Which worker to kill (pure): the largest of ``workers`` ({name: private bytes}) when
    they and the pod's own ``own`` bytes pass ``fraction`` of ``limit``; None otherwise."""
    if not workers or own + sum(workers.values()) <= fraction * limit:
        return None
    return max(sorted(workers), key=lambda name: workers[name])


def reclaim(
    pids: Mapping[str, int], *, limit: int | None, fraction: float = FRACTION
) -> str | None:
    """Kill the worker :func:`to_reclaim` names among ``pids`` ({instance: worker pid});
    the instance's name, or None."""
    if limit is None:
        return None
    usage = {name: rss_anon(pid) for name, pid in pids.items()}
    name = to_reclaim(usage, own=rss_anon(os.getpid()), limit=limit, fraction=fraction)
    if name is None:
        return None
    log.warning(
        "instance %s: its worker holds %d MiB of the pod's %d MiB limit; restarting it",
        name,
        usage[name] >> 20,
        limit >> 20,
    )
    try:
        os.kill(pids[name], signal.SIGKILL)
    except OSError:
        return None
    return name
