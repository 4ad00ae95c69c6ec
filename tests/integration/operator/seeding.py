"""A measured profile of the tiny model, shared by the operator tests that are not about
profiling, and its hand-over to a model as the profile ConfigMap the operator would have
written.

``MeasuredProfiles`` runs the real ``packrat profile`` once per run (the widest grid any
test asks for, every point measured: no time budget, so a loaded machine makes it slower,
never incomplete) and hands out the subset for a smaller ``maxBatch``: every point is
measured on its own (its co-located instances forked afresh), so the subset is what a run
over the smaller grid measures. Under pytest-xdist each worker's fixture points at one
folder: the first worker to ask measures under a file lock, the others wait and read it.

``seed_profile`` waits for the operator's first pass over a new model (its status names the
profile key, and its profiling Job has started), then stores the measured profile under that
key in a ConfigMap owned by the model, built by the operator's own builder. The operator finds
it on its next pass (the ConfigMap's watch event wakes it), deletes the Job it no longer needs
and plans from the profile: the path of a profile that appears while a Job runs.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from harness import TEST_IMAGE, OperatorCluster, wait_for

from packrat.controller.core.model import parse
from packrat.controller.profiling.manifests import profile_configmap
from packrat.plan.profile import Profile, load_profile, parse_profile

THREADS = (1, 2)
MAX_BATCH = 8  # the widest grid a test seeds (test_operator_autobatch's)
MEASURE_S = 900.0  # eight points in fresh processes, on a loaded 2-core machine


class MeasuredProfiles:
    """The tiny model's profile on 2 cores, threads 1 and 2, measured on first use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._lock = threading.Lock()
        self._profile: Profile | None = None

    def _shared(self) -> Profile:
        """The profile in ``workdir``, measured there first if no process has yet (the lock
        serialises the workers of one run; a failed measurement leaves no file behind)."""
        out = self.workdir / "tiny-profile.json"
        with (self.workdir / "tiny-profile.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not out.exists():
                partial = out.with_suffix(".partial.json")
                self._measure(partial)
                os.replace(partial, out)
        profile = load_profile(out)
        want = {(t, b) for t in THREADS for b in _batches(MAX_BATCH)}
        assert set(profile.index) == want, sorted(profile.index)
        return profile

    def _measure(self, out: Path) -> None:
        cmd = [
            sys.executable,
            "-m",
            "packrat",
            "profile",
            "--model",
            "tiny",
            "--cpus",
            "2",
            "--threads",
            ",".join(str(t) for t in THREADS),
            "--max-batch",
            str(MAX_BATCH),
            "--precision",
            "0.2",
            "--point-budget",
            "10",
            "-o",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=MEASURE_S)
        assert proc.returncode == 0, f"packrat profile failed: {proc.stderr[-2000:]}"

    def profile(self, max_batch: int) -> Profile:
        """The measured points with batch <= ``max_batch`` (a power of two <= MAX_BATCH)."""
        assert max_batch in _batches(MAX_BATCH), max_batch
        with self._lock:
            if self._profile is None:
                self._profile = self._shared()
            full = self._profile
        batches = _batches(max_batch)
        extra = {
            **full.meta.extra,
            "grid": {"threads": list(THREADS), "batches": batches},
            "complete": True,
        }
        return replace(full, meta=replace(full.meta, extra=extra)).with_points(
            p for p in full.points if p.batch in batches
        )


def _batches(max_batch: int) -> list[int]:
    out, b = [], 1
    while b <= max_batch:
        out.append(b)
        b *= 2
    return out


def seed_profile(
    cluster: OperatorCluster, name: str, profile: Profile, *, timeout: float = 240
) -> str:
    """Store ``profile`` as the model's profile ConfigMap once the operator has keyed it;
    the ConfigMap's name."""
    key = wait_for(
        lambda: (cluster.status(name).get("profile") or {}).get("key"),
        timeout=timeout,
        what=f"{name}'s profile key in status",
        period=0.1,
    )
    text = profile.to_json()
    parse_profile(text, origin="seeded profile")  # what the operator will read back
    model = parse(cluster.model(name), default_image=TEST_IMAGE)
    assert model.profile_key == key, "the operator keys profiles as the typed spec does"
    body = profile_configmap(model, profile_json=text, cpu_model=profile.meta.cpu_model)
    cm_name = str(body["metadata"]["name"])
    if cluster.api.get("configmaps", cm_name) is None:
        cluster.api.create("configmaps", body)
    return cm_name
