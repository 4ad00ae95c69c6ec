"""Pin a model-running process to its cores with thread settings that match them.

A thin instance only behaves like its profile when it runs exactly ``t`` intra-op threads on
exactly its ``t`` cores: more threads than cores oversubscribe, a wider affinity lets the
scheduler migrate threads onto a neighbour's cores. Child processes get :func:`thread_env`
before they start (OpenMP reads it once); a running process calls
:func:`pin_current_process` before its first inference.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["pin_current_process", "reader_split", "thread_env"]

# Every thread-count knob that the BLAS/OpenMP runtimes torch may load read at start-up.
_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "BLIS_NUM_THREADS",
)


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a child process that must use ``threads`` intra-op threads."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    env = dict.fromkeys(_THREAD_VARS, str(threads))
    env["MKL_DYNAMIC"] = "FALSE"
    env["OMP_DYNAMIC"] = "FALSE"
    return env


def _pin_all_threads(cpus: set[int]) -> None:
    """sched_setaffinity(0) pins only the calling thread: also pin any thread already running
    (e.g. an OpenMP pool started by an earlier torch call)."""
    os.sched_setaffinity(0, cpus)
    try:
        tids = [int(p.name) for p in Path("/proc/self/task").iterdir() if p.name.isdigit()]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError as exc:  # the thread may have exited meanwhile
            log.debug("could not pin thread %d: %s", tid, exc)


def pin_current_process(cpus: Sequence[int], *, threads: int) -> None:
    """Pin this process (all its threads) to ``cpus`` and use ``threads`` intra-op threads.

    Also sets inter-op threads to 1 where torch still allows it (it refuses once parallel
    work has started: that is logged, not raised) and exports :func:`thread_env` so that
    anything started later inherits the same limits.
    """
    wanted = set(cpus)
    if not wanted:
        raise ValueError("pin_current_process needs at least one cpu")
    env = thread_env(threads)
    if threads > len(wanted):
        log.warning("%d threads on %d cpus: the instance is oversubscribed", threads, len(wanted))
    _pin_all_threads(wanted)
    os.environ.update(env)

    import torch

    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError as exc:
            log.info("inter-op threads stay at %d (%s)", torch.get_num_interop_threads(), exc)


def reader_split(
    cpus: Iterable[int], compute_threads: int
) -> tuple[frozenset[int], frozenset[int]] | None:
    """(compute cores, reader core) for a process that computes on ``compute_threads``
    single-threaded workers and reads weights on one more thread: where the cores outnumber
    the compute threads, the highest core reads and the others compute, so that a read's CPU
    work (the kernel's page-cache work, done in the reader's context) never lands on a
    compute core; None where no core is spare (the reader shares the compute's cores)."""
    cores = sorted(set(cpus))
    if compute_threads < 1 or len(cores) <= compute_threads:
        return None
    return frozenset(cores[:-1]), frozenset(cores[-1:])
