"""``packrat plan`` shows when a batch runs on a larger batch's faster plan (issue 37 item 7)."""

from __future__ import annotations

import json

import pytest
from packaging_support import RESNET_PROFILE

from packrat.cli import main

PROFILE = RESNET_PROFILE
ARGS = ["plan", "--profile", str(PROFILE), "--cpus", "16"]


def test_the_table_marks_a_padded_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--batch", "62,63,64"]) == 0
    out = capsys.readouterr().out.splitlines()
    row63 = next(line for line in out if line.split()[1:2] == ["63"])
    assert "16x1t/b4" in row63 and "220.94" in row63 and row63.rstrip().endswith("64*")
    assert not any(line.rstrip().endswith("*") for line in out if line.split()[1:2] == ["64"])
    assert out[-1] == (
        "* batch 63 runs on the plan for batch 64 (1 slot idle): faster than any plan for "
        "exactly 63"
    )


def test_exact_keeps_the_sum(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--batch", "63", "--exact", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["capacity"] == 63 and round(doc["expected_latency_ms"], 1) == 353.7


def test_json_says_the_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--batch", "63", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["batch"], doc["capacity"], round(doc["expected_latency_ms"], 1)) == (63, 64, 220.9)
