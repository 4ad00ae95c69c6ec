"""A user's TorchServe archive for tests: a custom handler (a Linear(8, 4) behind a
preprocess step that sleeps a given time), packed by the real torch-model-archiver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HANDLER = """
import json, time
import torch


class SleepyHandler:
    PREPROCESS_S = {sleep}

    def initialize(self, context):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 4).eval()
        self.seen = 0

    def preprocess(self, data):
        time.sleep(self.PREPROCESS_S)
        rows = [row.get("body", row.get("data")) for row in data]
        return torch.tensor(rows, dtype=torch.float32)

    def handle(self, data, context):
        x = self.preprocess(data)
        with torch.inference_mode():
            y = self.model(x)
        return [json.dumps(row) for row in y.tolist()]
"""


def build_mar(tmp: Path, name: str, sleep_s: float) -> Path:
    src = tmp / f"{name}-src"
    src.mkdir()
    (src / "sleepy_handler.py").write_text(HANDLER.format(sleep=sleep_s))
    return archive(tmp, name, src / "sleepy_handler.py")


def archive(tmp: Path, name: str, handler: Path) -> Path:
    """``handler`` packed as ``tmp/<name>.mar`` (version 1.0) by the real torch-model-archiver."""
    subprocess.run(
        [
            str(Path(sys.executable).with_name("torch-model-archiver")),
            "--model-name",
            name,
            "--version",
            "1.0",
            "--handler",
            str(handler),
            "--export-path",
            str(tmp),
        ],
        check=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        timeout=120,
    )
    return tmp / f"{name}.mar"
