"""The serving benchmark's pure parts: the configurations it compares and its report."""

from __future__ import annotations

import argparse

from packrat.bench.serving import (
    MIN_BURSTS,
    BenchResult,
    BenchSettings,
    Run,
    config_plans,
    format_table,
)
from packrat.plan.baselines import FAT, PER_CORE, baseline_plan, expected_latency
from packrat.plan.optimizer import Optimizer

TABLE = {
    (1, 2): 100.0, (1, 4): 190.0, (1, 8): 400.0,
    (2, 2): 70.0, (2, 4): 130.0, (2, 8): 300.0,
}  # fmt: skip


def test_configurations_for_a_plan() -> None:
    plan = Optimizer(TABLE, cpus=2, max_batch=8).plan(8)
    assert plan.label == "2x1t/b4"  # 190 ms beats the fat 300 ms
    plans = config_plans(plan, TABLE)
    assert plans["packrat"] is plan and plans["torchserve"] is None
    fat, per_core = plans[FAT], plans[PER_CORE]
    assert fat is not None and per_core is not None
    assert fat.expand() == [(2, 8)] and fat.expected_latency_ms == 300.0
    assert per_core.expand() == [(1, 4), (1, 4)] and per_core.expected_latency_ms == 190.0


def test_one_instance_per_core_splits_the_batch_evenly() -> None:
    table = {(3, 7): 1.0, (1, 7): 5.0, (1, 2): 2.0, (1, 3): 3.0}
    per_core = baseline_plan(PER_CORE, cpus=3, batch=7, table=table)
    assert sorted(b for _, b in per_core.expand()) == [2, 2, 3]
    assert all(t == 1 for t, _ in per_core.expand())
    assert expected_latency(tuple(per_core.expand()), table) == 3.0
    assert expected_latency(tuple(per_core.expand()), {(3, 7): 1.0}) is None


def test_settings_from_the_bench_cli() -> None:
    args = argparse.Namespace(model="resnet50", batch="4,8", cpus=2, repeats=None, requests=40)
    s = BenchSettings.from_args(args)
    assert (s.batches, s.cpus, s.repeats, s.requests, s.profile) == ([4, 8], 2, 3, 40, None)
    # at least MIN_BURSTS per run at every B: --requests 32 at B=32 was a single burst
    assert MIN_BURSTS == 8
    assert (s.bursts(4), s.bursts(8), s.bursts(32)) == (10, 8, 8)
    assert s.runtime is None  # packrat serve's default
    from packrat.cli import build_parser

    argv = "bench --serving --model tiny --cpus 2 --batch 4 --runtime torchserve"
    parsed = build_parser().parse_args(argv.split())
    assert BenchSettings.from_args(parsed).runtime == "torchserve"


def test_summary_and_table_report_medians_and_speedups() -> None:
    plan = Optimizer(TABLE, cpus=2, max_batch=8).plan(8)
    result = BenchResult(settings={"model": "m", "repeats": 2, "requests": 3}, cpus=[0, 1])
    result.plans[8] = {**plan.to_dict(), "expected_speedup_per_core": 1.0}
    for repeat, (ours, fat) in enumerate([(200.0, 300.0), (220.0, 360.0)]):
        result.runs.append(Run("packrat", 8, repeat, plan.label, [ours, ours + 1, ours - 1], 0))
        result.runs.append(Run("fat", 8, repeat, "1x2t/b8", [fat] * 3, 0))
    summary = result.summary()
    row = summary["batches"][8]
    assert row["configs"]["packrat"]["median_ms"] == 210.0
    assert row["configs"]["fat"]["min_ms"] == 300.0 and row["configs"]["fat"]["max_ms"] == 360.0
    assert row["speedup"]["fat"] == 330.0 / 210.0
    assert row["expected_speedup"]["fat"] == 300.0 / 190.0
    text = format_table(summary)
    assert "speedup of packrat over: fat 1.57x" in text
    assert "expected (optimizer):    fat 1.58x" in text
