"""Integration tests of the real profiler: worker processes, pinning, checkpoint and resume.

Real processes on the tiny zoo model with small budgets; no timing assertions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint, load_profile
from packrat.profiler.client import ForkedWorkers, WorkerProcess
from packrat.profiler.profiler import ProfilerError, ProfileRun, ProfileSettings, run_profile
from packrat.runtime.cpus import allowed_cpus
from packrat.runtime.zoo import model_digest

pytestmark = pytest.mark.integration

CPUS = allowed_cpus()
T = min(2, len(CPUS))
FAST = ProfileSettings(precision=0.2, point_budget_s=0.5, warmup=1, min_samples=3)
# Every point runs its whole budget: a precision no sample set reaches.
SLOW = ProfileSettings(precision=1e-9, point_budget_s=1.0, warmup=1, min_samples=3)


def _packrat(*args: str) -> list[str]:
    return [sys.executable, "-m", "packrat", *args]


def _run(args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _packrat(*args.split()), check=False, capture_output=True, text=True, timeout=120
    )


def test_worker_reports_its_pinning() -> None:
    cpu = CPUS[-1]
    with WorkerProcess.start(spec="tiny", cpus=[cpu], threads=1) as worker:
        assert worker.ready["affinity"] == [cpu]
        worker.request({"cmd": "warmup", "batch": 4, "n": 2}, timeout=60)
        info = worker.request({"cmd": "info"}, timeout=60)
        assert info["affinity"] == [cpu]
        assert info["thread_affinity"] == [cpu]  # every thread, pools included
        assert info["threads"] == 1
        assert info["interop_threads"] == 1
        assert info["omp_num_threads"] == "1"
        run = worker.request({"cmd": "run", "batch": 2}, timeout=60)
        assert run["end"] >= run["start"]
    assert worker.proc.returncode == 0


def test_worker_start_failure_is_reported() -> None:
    with pytest.raises(Exception, match="unknown model"):
        WorkerProcess.start(spec="no-such-model", cpus=[CPUS[0]], threads=1)


def test_profile_tiny_grid_and_pinning(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    reports: list[tuple[ProfilePoint, dict[str, Any]]] = []
    run = run_profile(
        spec="tiny",
        cpus=T,
        max_batch=2,
        output=out,
        settings=FAST,
        on_point=lambda p, r: reports.append((p, r)),
    )
    profile = load_profile(out)
    assert run.stopped == "complete" and not run.missing
    expected = {(t, b) for t in range(1, T + 1) for b in (1, 2)}
    assert set(profile.index) == expected
    for p in profile.points:
        assert p.latency_ms > 0 and p.samples is not None and p.samples >= 1
        assert p.p50_ms is not None and p.p99_ms is not None and p.p99_ms >= p.p50_ms > 0
        assert p.cv is not None and p.cv >= 0
    meta = profile.meta
    assert meta.model == "tiny" and meta.cpus == T and meta.model_digest.startswith("sha256:")
    assert meta.torch_version and meta.cpu_model and meta.created
    assert meta.extra["complete"] is True
    # each point ran pinned to exactly `t` of the allowed cores with `t` intra-op threads
    assert len(reports) == len(expected)
    for point, report in reports:
        ready = report["ready"]
        assert ready["threads"] == point.threads
        assert len(ready["affinity"]) == point.threads
        assert set(ready["affinity"]) <= set(CPUS)
        assert ready["interop_threads"] == 1
        assert report["startup_s"] > 0


def _budgeted_partial_run(out: Path) -> ProfileRun:
    """A run its time budget stops after some but not all points. Which budget does that
    depends on how busy the machine is (worker start-up, calibration): a budget stops a run
    partway when it leaves the first point its second of budget but not the last, a window
    from about start-up + 1 s to start-up + 2 points' budgets. The budget is searched for:
    a run that measured nothing raises it (aimed at the middle of the window from the
    start-up it saw), a run that finished lowers it, halving the gap each time."""
    settings = replace(SLOW, point_budget_s=2.0)
    low, high = 0.0, float("inf")
    budget = 1.5
    for _attempt in range(12):
        out.unlink(missing_ok=True)
        run = run_profile(
            spec="tiny",
            cpus=1,
            max_batch=4,
            output=out,
            settings=replace(settings, time_budget_s=budget),
        )
        if run.stopped == "time_budget" and run.measured and run.missing:
            return run
        if run.stopped == "time_budget":  # stopped before a point: too little
            low = budget
            aim = max(budget * 1.3, run.startup_s + 1.0 + settings.point_budget_s)
            budget = aim if high == float("inf") else (low + high) / 2
        else:  # the whole grid fit: too much
            high = budget
            budget = (low + high) / 2
    raise AssertionError(f"no budget stopped the run partway (last tried {budget:.1f} s)")


def _kept_unless_remeasured(before: dict[Any, Any], after: Profile) -> None:
    """Points of the first run are kept by the rerun, except those its isolation check
    re-measured as suspects (recorded in the profile, the lower mean kept)."""
    remeasured = (after.meta.extra.get("isolation") or {}).get("remeasured") or {}
    for key, point in before.items():
        if f"t{key[0]}b{key[1]}" not in remeasured:
            assert after.index[key] == point, key
        else:
            assert after.index[key].latency_ms <= point.latency_ms, key


def test_time_budget_stops_cleanly_and_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "budget.json"
    _budgeted_partial_run(out)
    saved = load_profile(out)
    assert saved.meta.extra["complete"] is False
    before = saved.index
    second = run_profile(spec="tiny", cpus=1, max_batch=4, output=out, settings=FAST)
    assert sorted(second.kept) == sorted(before)
    assert not set(second.measured) & set(before)
    after = load_profile(out)
    assert set(after.index) == {(1, 1), (1, 2), (1, 4)}
    _kept_unless_remeasured(before, after)
    assert after.meta.extra["complete"] is True


def test_killed_cli_run_resumes(tmp_path: Path) -> None:
    out = tmp_path / "killed.json"
    args = [
        "profile", "--model", "tiny", "--cpus", "1", "--max-batch", "4", "-o", str(out),
        "--precision", "1e-9", "--point-budget", "1", "--warmup", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(_packrat(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert out.exists(), "the first point was checkpointed before the kill"
    before = load_profile(out).index
    assert 1 <= len(before) < 3, "killed after the first checkpoint, before the end"
    # the rerun may measure differently (precision, budgets): only the metadata must match
    fast = [*args[:9], "--precision", "0.5", "--point-budget", "0.2", "--warmup", "0"]
    done = _run(" ".join(fast))
    assert done.returncode == 0, done.stderr
    assert f"{len(before)} kept" in done.stderr
    after = load_profile(out)
    assert set(after.index) == {(1, 1), (1, 2), (1, 4)}
    _kept_unless_remeasured(before, after)


def test_refuses_a_profile_of_another_model(tmp_path: Path) -> None:
    out = tmp_path / "other.json"
    other = Profile(
        meta=ProfileMeta(model="resnet50", model_digest="sha256:other", cpus=1),
        points=(ProfilePoint(1, 1, 50.0),),
    )
    other.save(out)
    with pytest.raises(ProfilerError, match="refusing to mix"):
        run_profile(spec="tiny", cpus=1, max_batch=1, output=out, settings=FAST)
    cli = _run(f"profile --model tiny --cpus 1 --max-batch 1 -o {out}")
    assert cli.returncode == 2
    assert "refusing to mix" in cli.stderr
    assert json.loads(out.read_text())["meta"]["model"] == "resnet50"  # untouched


def test_profile_verifies_plans_against_the_fat_instance(tmp_path: Path) -> None:
    """``--verify-batches``: after the grid, the plan and the fat instance really run, and
    the measured speedup is kept in the profile next to the expected one."""
    out = tmp_path / "verified.json"
    cli = _run(
        f"profile --model tiny --cpus {T} --max-batch 2 --precision 0.2 --point-budget 0.5 "
        f"--warmup 1 --min-samples 3 --allow-contended --verify-batches 1,2 --verify-repeats 3 "
        f"-o {out}"
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    record = json.loads(out.read_text())["meta"]["extra"]["verified"]
    assert "error" not in record, record
    assert [r["batch"] for r in record["results"]] == [1, 2]
    for r in record["results"]:
        assert r["planMs"] > 0 and r["fatMs"] > 0
        assert r["speedup"] == pytest.approx(r["fatMs"] / r["planMs"], rel=0.01)
        assert r["plan"]["batch"] == r["batch"] and r["label"] == r["plan"]["label"]
    assert "verified B=2" in cli.stderr
    assert load_profile(out).points  # still a valid profile


def test_refuses_more_cpus_than_allowed(tmp_path: Path) -> None:
    with pytest.raises(ProfilerError, match="may only use"):
        run_profile(spec="tiny", cpus=len(CPUS) + 1, max_batch=1, output=tmp_path / "x.json")


@pytest.mark.skipif(os.cpu_count() is None, reason="no cpu count")
def test_bench_tiny_json(tmp_path: Path) -> None:
    # A synthetic profile (the plans it implies do not matter here; the bench measures).
    profile_path = tmp_path / "p.json"
    points = [
        ProfilePoint(t, b, 0.01 * b / t + 0.002 * t) for t in range(1, T + 1) for b in (1, 2, 4)
    ]
    meta = ProfileMeta(model="tiny", model_digest=model_digest("tiny"), cpus=T)
    Profile(meta=meta, points=tuple(points)).save(profile_path)
    done = _run(
        f"bench --model tiny --cpus {T} --batch 2,4 --profile {profile_path} "
        "--repeats 3 --warmup 1 --format json"
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["cpus"] == T
    assert [r["batch"] for r in payload["results"]] == [2, 4]
    for result in payload["results"]:
        assert set(result["configs"]) == {"plan", "fat", "per_core"}
        for name, config in result["configs"].items():
            assert len(config["samples_ms"]) == 3, name
            assert 0 < config["min_ms"] <= config["median_ms"] <= config["max_ms"]
            instances = config["instances"]
            assert sum(i["batch"] for i in instances) == result["batch"]
            cores = [c for i in instances for c in i["cpus"].split(",")]
            assert len(cores) == len(set(cores))  # disjoint core sets
        assert result["measured_speedup"] > 0
        assert result["expected_speedup"] > 0
        assert result["actual_over_expected"] == pytest.approx(
            result["measured_speedup"] / result["expected_speedup"]
        )
        assert result["configs"]["fat"]["instances"] == [
            {
                "threads": T,
                "batch": result["batch"],
                "cpus": result["configs"]["fat"]["instances"][0]["cpus"],
            }
        ]


def test_bench_quick_profile_without_file(tmp_path: Path) -> None:
    saved = tmp_path / "quick.json"
    done = _run(
        "bench --model tiny --cpus 1 --batch 3 --repeats 2 --warmup 0 "
        f"--profile-budget 0.3 --save-profile {saved}"
    )
    assert done.returncode == 0, done.stderr
    assert "1x1t/b3" in done.stdout  # one core: the plan is the fat instance
    assert (1, 3) in load_profile(saved).index  # B itself was profiled


def test_forked_workers_are_pinned_and_independent() -> None:
    """Workers forked from one fork server: each pinned (every thread) to its own cores with
    its own thread counts, killing one leaves the other serving."""
    source = ForkedWorkers("tiny")
    try:
        source.start()
        assert source.startup_s > 0 and source.server is not None
        assert source.server.ready["threads"] == 1  # no thread pool in the server
        workers = [source.spawn(cpus=[c], threads=1) for c in CPUS[:T]]
        for worker, cpu in zip(workers, CPUS[:T], strict=False):
            ready = worker.wait_ready(timeout=60)
            assert ready["forked"] is True and ready["affinity"] == [cpu]
            worker.request({"cmd": "warmup", "batch": 4, "n": 2}, timeout=60)
            info = worker.request({"cmd": "info"}, timeout=60)
            assert info["thread_affinity"] == [cpu]  # pools started after the fork, pinned
            assert info["threads"] == 1 and info["interop_threads"] == 1
        workers[0].kill()
        run = workers[-1].request({"cmd": "run", "batch": 2}, timeout=60)
        assert run["end"] >= run["start"] and run["cpu_s"] >= 0
        wide = source.spawn(cpus=CPUS[:T], threads=T)
        assert wide.wait_ready(timeout=60)["threads"] == T
        wide.close()
        workers[-1].close()
    finally:
        source.close()
    assert source.server is None


@pytest.mark.parametrize("mode", ["co-located", "alone"])
def test_profile_modes_lay_out_their_instances(tmp_path: Path, mode: str) -> None:
    """co-located: floor(T/t) timed instances on disjoint cores per point; alone: one. The
    mode is in the profile's meta. (Fresh worker processes: test_worker_reports_its_pinning.)"""
    reports: list[tuple[ProfilePoint, dict[str, Any]]] = []
    run = run_profile(
        spec="tiny",
        cpus=T,
        max_batch=1,
        output=tmp_path / "p.json",
        settings=replace(FAST, mode=mode),
        on_point=lambda p, r: reports.append((p, r)),
    )
    profile = load_profile(tmp_path / "p.json")
    assert profile.meta.mode == mode and not run.missing
    assert profile.meta.extra["startup_s"]["workers"] == pytest.approx(run.startup_s, abs=0.01)
    for point, report in reports:
        readies = report["readies"]
        count = T // point.threads if mode == "co-located" else 1
        assert report["instances"] == count == len(readies)
        cores = [c for ready in readies for c in ready["affinity"]]
        assert len(cores) == len(set(cores)) == count * point.threads  # disjoint
        assert all(ready["forked"] is True for ready in readies)
        assert point.samples is not None and point.samples >= count * FAST.min_samples
        label = f"t{point.threads}b{point.batch}"
        assert profile.meta.extra["colocated"][label]["instances"] == count
