"""The alert rules checked by Prometheus' own tool: `promtool check rules` (syntax, templates)
and `promtool test rules` (the unit tests in packrat-alerts.test.yaml: each alert fires on the
input series that should fire it, after its `for`, and not on the healthy ones)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_support import RULES, missing_reason, tool

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        missing_reason("promtool") is not None, reason=str(missing_reason("promtool"))
    ),
]


def _promtool(*args: str, cwd: Path = RULES) -> subprocess.CompletedProcess[str]:
    binary = tool("promtool")
    assert binary is not None
    return subprocess.run(
        [str(binary), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules() -> None:
    out = _promtool("check", "rules", "packrat-alerts.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout


def test_promtool_test_rules() -> None:
    out = _promtool("test", "rules", "packrat-alerts.test.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules_catches_a_wrong_expectation(tmp_path: Path) -> None:
    # the unit tests are not vacuous: the same file with one expectation flipped fails
    text = (RULES / "packrat-alerts.test.yaml").read_text()
    broken = text.replace("model: hot}", "model: calm}", 1)
    assert broken != text
    (tmp_path / "packrat-alerts.yaml").write_text((RULES / "packrat-alerts.yaml").read_text())
    (tmp_path / "t.yaml").write_text(broken)
    out = _promtool("test", "rules", "t.yaml", cwd=tmp_path)
    assert out.returncode != 0
    assert "PackratShedRatioHigh" in out.stdout + out.stderr
