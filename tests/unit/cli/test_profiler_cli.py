"""Unit tests for the ``packrat profile`` and ``packrat bench`` command lines (no processes)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

from packrat.cli import build_parser
from packrat.cli.profile import format_profile_table
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint


def _parse(command: str) -> argparse.Namespace:
    return build_parser().parse_args(command.split())


def test_profile_options() -> None:
    args = _parse(
        "profile --model resnet50 --cpus 2 --max-batch 32 -o p.json --threads 1,2 "
        "--precision 0.05 --point-budget 7 --time-budget 60 --warmup 1 --min-samples 3"
    )
    assert (args.model, args.cpus, args.max_batch, args.output) == (
        "resnet50",
        2,
        32,
        Path("p.json"),
    )
    assert args.threads == "1,2" and args.precision == 0.05
    assert args.point_budget == 7 and args.time_budget == 60
    assert args.warmup == 1 and args.min_samples == 3


def test_profile_defaults() -> None:
    args = _parse("profile --model tiny --cpus 1 -o x.json")
    assert args.max_batch == 32 and args.precision == 0.02 and args.time_budget is None


def test_bench_options() -> None:
    args = _parse(
        "bench --model tiny --cpus 2 --batch 4,8 --profile p.json --repeats 5 --format json"
    )
    assert args.batch == "4,8" and args.profile == Path("p.json")
    assert args.repeats == 5 and args.format == "json" and not args.serving
    assert args.requests is None and args.output is None


def test_bench_serving_dispatches_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []
    fake = types.ModuleType("packrat.bench.serving")

    def run_serving_bench(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    fake.run_serving_bench = run_serving_bench  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "packrat.bench.serving", fake)
    args = _parse("bench --model tiny --cpus 2 --batch 4 --serving --requests 9 --repeats 2")
    assert args.func(args) == 7
    assert seen and seen[0].requests == 9 and seen[0].repeats == 2


def test_profile_table() -> None:
    profile = Profile(
        meta=ProfileMeta(model="m", cpus=2),
        points=(ProfilePoint(1, 1, 0.01234), ProfilePoint(2, 1, 12.5), ProfilePoint(1, 2, 20.0)),
    )
    lines = format_profile_table(profile).splitlines()
    assert lines[0].split() == ["batch", "t=1", "ms", "t=2", "ms"]
    assert lines[1].split() == ["1", "0.0123", "12.50"]
    assert lines[2].split() == ["2", "20.00", "-"]
