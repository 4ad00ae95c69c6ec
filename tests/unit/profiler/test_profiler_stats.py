"""Unit tests for the profiler's pure parts: statistics, progress, grids, bench configs."""

from __future__ import annotations

import io
import math
import statistics
from pathlib import Path

import pytest

from packrat.bench.microbench import BenchConfig, bench_configs
from packrat.plan.baselines import even_split
from packrat.plan.optimizer import optimize
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint
from packrat.profiler.profiler import (
    ProfilerError,
    ProfileSettings,
    _existing,
    batch_grid,
    profile_cpus,
    thread_grid,
)
from packrat.profiler.progress import Progress, bar, format_duration
from packrat.profiler.stats import (
    ci_halfwidth,
    precise_enough,
    quantile,
    summarize,
    t_critical,
)


# -- statistics ------------------------------------------------------------------------------
def test_t_critical_matches_tables() -> None:
    assert t_critical(1) == pytest.approx(12.706, abs=1e-3)
    assert t_critical(10) == pytest.approx(2.228, abs=1e-3)
    assert t_critical(11) == pytest.approx(2.201, abs=2e-3)
    assert t_critical(20) == pytest.approx(2.086, abs=2e-3)
    assert t_critical(30) == pytest.approx(2.042, abs=2e-3)
    assert t_critical(1000) == pytest.approx(1.962, abs=2e-3)
    with pytest.raises(ValueError):
        t_critical(0)


def test_summary_against_statistics_module() -> None:
    values = [10.0, 12.0, 11.0, 13.0, 50.0, 11.5, 10.5]
    s = summarize(values)
    assert s.n == 7
    assert s.mean == pytest.approx(statistics.fmean(values))
    assert s.stdev == pytest.approx(statistics.stdev(values))
    assert s.p50 == pytest.approx(statistics.median(values))
    assert s.cv == pytest.approx(s.stdev / s.mean)
    assert s.min == 10.0 and s.max == 50.0
    assert s.p25 <= s.p50 <= s.p75 <= s.p99 <= s.max
    assert s.ci95 == pytest.approx(t_critical(6) * s.stdev / math.sqrt(7))


def test_quantile_interpolates() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.99) == 5.0
    assert quantile([1.0, 3.0], 0.25) == 1.5
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_single_sample() -> None:
    s = summarize([3.0])
    assert s.cv == 0.0 and math.isinf(s.ci95)
    assert math.isinf(ci_halfwidth([1.0]))


def test_stopping_rule() -> None:
    steady = [100.0, 100.5, 99.5, 100.2, 99.8]
    assert precise_enough(steady, precision=0.02, min_samples=5)
    assert not precise_enough(steady, precision=0.02, min_samples=6)
    noisy = [100.0, 150.0, 60.0, 120.0, 80.0]
    assert not precise_enough(noisy, precision=0.02, min_samples=2)
    assert not precise_enough([1.0], precision=0.5, min_samples=1)


# -- progress --------------------------------------------------------------------------------
def test_progress_eta_and_lines() -> None:
    out = io.StringIO()
    progress = Progress(4, stream=out, label="p")
    assert math.isinf(progress.eta())
    progress.step("a", seconds=2.0)
    assert progress.eta() == pytest.approx(6.0)
    assert progress.eta(cap=1.0) == 1.0
    progress.step("skipped")  # not timed: does not change the per-step estimate
    assert progress.eta() == pytest.approx(4.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # per step: the bar, then the same as a record (data)
    assert "1/4" in lines[0] and "ETA 0:06" in lines[0] and lines[0].endswith("a")
    assert lines[1].startswith("packrat-progress ") and '"etaSeconds": 6' in lines[1]
    assert format_duration(3725) == "1:02:05"
    assert format_duration(float("inf")) == "?"
    assert bar(1, 2, width=4) == "[##..]"


# -- grids and settings ----------------------------------------------------------------------
def test_grids() -> None:
    assert batch_grid(32) == [1, 2, 4, 8, 16, 32]
    assert batch_grid(20, extra=[12, 64]) == [1, 2, 4, 8, 12, 16]
    assert thread_grid(3) == [1, 2, 3]
    assert thread_grid(4, [4, 1, 2, 2]) == [1, 2, 4]
    with pytest.raises(ProfilerError, match="outside 1..2"):
        thread_grid(2, [3])
    with pytest.raises(ProfilerError):
        batch_grid(0)


def test_settings_are_checked() -> None:
    ProfileSettings().check()
    with pytest.raises(ProfilerError, match="precision"):
        ProfileSettings(precision=0).check()
    with pytest.raises(ProfilerError, match="time-budget"):
        ProfileSettings(time_budget_s=-1).check()


def test_profile_cpus_uses_the_allowed_set_not_zero() -> None:
    assert profile_cpus(2, allowed=[6, 7, 9]) == [6, 7]
    with pytest.raises(ProfilerError, match="may only use 1 cpu"):
        profile_cpus(2, allowed=[5])


# -- resume metadata -------------------------------------------------------------------------
def _profile(**meta: object) -> Profile:
    base = {"model": "tiny", "model_digest": "sha256:aa", "cpu_model": "X", "cpus": 2}
    base.update(meta)
    return Profile(
        meta=ProfileMeta(**base),  # type: ignore[arg-type]
        points=(ProfilePoint(1, 1, 1.0),),
    )


def test_existing_profile_is_reused_only_when_it_matches(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    want = ProfileMeta(model="tiny", model_digest="sha256:aa", cpu_model="X", cpus=2)
    assert _existing(path, want) is None
    _profile().save(path)
    old = _existing(path, want)
    assert old is not None and old.latency(1, 1) == 1.0
    _profile(model_digest="sha256:bb", cpus=4).save(path)
    with pytest.raises(ProfilerError, match=r"model digest .* cpus 4 .*refusing"):
        _existing(path, want)
    path.write_text("garbage")
    with pytest.raises(ProfilerError, match="not a readable profile"):
        _existing(path, want)


# -- bench configurations --------------------------------------------------------------------
def test_even_split() -> None:
    assert even_split(8, 2) == [4, 4]
    assert even_split(7, 3) == [3, 2, 2]
    assert even_split(2, 4) == [1, 1]
    assert sum(even_split(33, 8)) == 33


def test_bench_configs() -> None:
    table = {(1, 1): 10.0, (1, 2): 19.0, (2, 2): 12.0, (2, 4): 30.0, (1, 4): 40.0}
    plan = optimize(table, cpus=2, batch=4)
    configs = {c.name: c for c in bench_configs(plan, table)}
    assert configs["plan"].instances == ((1, 2), (1, 2))
    assert configs["plan"].expected_ms == plan.expected_latency_ms == 19.0
    assert configs["fat"].instances == ((2, 4),) and configs["fat"].expected_ms == 30.0
    assert configs["per_core"].instances == ((1, 2), (1, 2))
    assert configs["per_core"].expected_ms == 19.0
    assert configs["plan"].label == "2x1t/b2"
    assert BenchConfig("x", ((2, 4), (1, 1), (1, 1)), None).label == "1x2t/b4+2x1t/b1"


def test_estimate_seconds_extrapolates_by_batch() -> None:
    from packrat.profiler.profiler import estimate_seconds

    settings = ProfileSettings(warmup=2, min_samples=5, point_budget_s=100.0)
    points = {(1, 4): ProfilePoint(1, 4, 1000.0, samples=5)}
    assert estimate_seconds([(1, 8)], {}, settings=settings, startup_s=1.0) is None
    # (2 warm-up + 5 samples) x 2 s + 1 s start-up
    assert estimate_seconds([(1, 8)], points, settings=settings, startup_s=1.0) == pytest.approx(
        15.0
    )
    # another thread count scales by threads; the per-point budget caps a point
    assert estimate_seconds([(2, 4)], points, settings=settings, startup_s=0.0) == pytest.approx(
        3.5
    )
    capped = ProfileSettings(warmup=2, min_samples=5, point_budget_s=3.0)
    assert estimate_seconds([(1, 8)], points, settings=capped, startup_s=0.0) == pytest.approx(5.0)
