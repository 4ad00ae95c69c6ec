"""Issue 26, LOW items for the command line and the specs: a trace or a pipeline too large to
plan, a YAML nested too deeply, and names that matched with a trailing newline each get one
clear line (exit 2) or an invalid spec, never a traceback or minutes of planning."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.controller.core.model import InvalidSpec, parse
from packrat.controller.pipeline.spec import parse_pipeline
from packrat.plan.traces import MAX_ARRIVALS

PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-pytorch.csv"


def _deep() -> str:
    """YAML nested past the interpreter's recursion limit (another test may have raised it)."""
    depth = sys.getrecursionlimit() + 200
    return "a: " + "[" * depth + "]" * depth + "\n"


def test_a_trace_too_long_to_plan(tmp_path: Path, refused: Callable[[list[str], str], str]) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("0\n" * (MAX_ARRIVALS + 2))
    args = ["provision", "--profile", str(PROFILE), "--slo-p99-ms", "500"]
    refused([*args, "--trace", str(trace)], "sample it down")
    refused([*args, "--rate", "1e6", "--duration", "60"], "at most")


def test_a_pipeline_with_too_many_stages(
    pipeline_file: Callable[[str], Path],
    refused: Callable[[list[str], str], str],
) -> None:
    stages = "".join(
        f"  - {{name: s{i}, profile: resnet-pytorch.csv, maxCpus: 2}}\n" for i in range(17)
    )
    path = pipeline_file(f"stages:\n{stages}slo: {{latencyP99Ms: 900}}\n")
    refused(
        ["provision", "--pipeline", str(path), "--rate", "5", "--duration", "5"],
        "at most 16 stages",
    )


def test_deep_yaml_is_one_line(
    tmp_path: Path,
    pipeline_file: Callable[[str], Path],
    refused: Callable[[list[str], str], str],
) -> None:
    path = pipeline_file(_deep())
    refused(
        ["provision", "--pipeline", str(path), "--rate", "5", "--duration", "5"],
        "nested too deeply",
    )
    config = tmp_path / "router.yaml"
    config.write_text(_deep())
    refused(["route", "--config", str(config)], "nested too deeply")


def test_names_do_not_match_with_a_trailing_newline() -> None:
    model = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "model": {
                "storageUri": "s3://b/m.mar",
                "format": "mar",
                "sampleRequest": "e30=",
                "sampleContentType": "application/json\n",
            },
            "cpus": 2,
        },
    }
    with pytest.raises(InvalidSpec, match="sampleContentType"):
        parse(model, default_image="img")
    pipeline = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "stages": [{"name": "first\n", "model": {"model": {"zoo": "tiny"}, "cpus": 2}}],
            "slo": {"latencyP99Ms": 200},
        },
    }
    with pytest.raises(Exception, match=r"stages\[0\]\.name"):
        parse_pipeline(pipeline)
