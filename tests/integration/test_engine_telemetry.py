"""No engine library phones home from a Packrat process: importing packrat first turns off
ONNX Runtime's telemetry thread and OpenVINO's telemetry sender, so a zygote holds no extra
thread when it forks and a serving pod sends nothing out. Fresh interpreters, with the
environment a user or a pod has (no CI variables, which both libraries also honour)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CI_VARIABLES = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "JENKINS_URL", "ORT_DISABLE_TELEMETRY")

PROBE = """
import importlib, json, os, sys
first = sys.argv[1]
if first == "packrat":
    import packrat
before = len(os.listdir("/proc/self/task"))
importlib.import_module(sys.argv[2])
if sys.argv[2] == "openvino":
    from openvino.tools.ovc import telemetry_utils
    sender = telemetry_utils.tm.__name__
else:
    sender = None
print(json.dumps({"threads": len(os.listdir("/proc/self/task")) - before, "sender": sender}))
"""


def _probe(first: str, engine: str, home: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES}
    env["HOME"] = str(home)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, first, engine],
        capture_output=True, text=True, timeout=150, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_onnxruntime_starts_no_telemetry_thread_after_packrat(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the onnxruntime extra is not installed")
    plain = _probe("none", "onnxruntime", tmp_path)
    ours = _probe("packrat", "onnxruntime", tmp_path)
    assert int(ours["threads"]) < int(plain["threads"])  # type: ignore[call-overload]


def test_openvino_sends_nothing_and_writes_nothing_after_packrat(tmp_path: Path) -> None:
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    (tmp_path / "ours").mkdir()
    ours = _probe("packrat", "openvino", tmp_path / "ours")
    assert ours["sender"] == "openvino.tools.ovc.telemetry_stub"
    assert not (tmp_path / "ours" / "intel").exists()  # no client id, no usage counter
    (tmp_path / "plain").mkdir()
    plain = _probe("none", "openvino", tmp_path / "plain")
    assert plain["sender"] != "openvino.tools.ovc.telemetry_stub"  # what packrat turns off
