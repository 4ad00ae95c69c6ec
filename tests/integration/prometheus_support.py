"""A real Prometheus server for tests: found where `make prometheus-tools` installs it
(.venv/prometheus/bin, from Debian's `prometheus` package) or on PATH, started on loopback
with a generated config, and queried through its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "packrat-operator" / "rules"


def tool(name: str) -> Path | None:
    """The prometheus or promtool binary: $PACKRAT_PROMETHEUS_BIN, .venv/prometheus/bin, PATH."""
    candidates = [
        os.environ.get("PACKRAT_PROMETHEUS_BIN", ""),
        str(Path(sys.prefix) / "prometheus" / "bin"),
        str(ROOT / ".venv" / "prometheus" / "bin"),
    ]
    for directory in candidates:
        if directory and (Path(directory) / name).is_file():
            return Path(directory) / name
    found = shutil.which(name)
    return Path(found) if found else None


def missing_reason(*names: str) -> str | None:
    missing = [n for n in names if tool(n) is None]
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} not installed: run `make prometheus-tools` (Debian package "
        "prometheus, unpacked into .venv/prometheus) or put them on PATH"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """One Prometheus process; ``scrape_configs`` as in prometheus.yml."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: list[dict[str, Any]],
        *,
        rule_files: list[Path] | None = None,
        interval: str = "1s",
    ) -> None:
        binary = tool("prometheus")
        assert binary is not None, missing_reason("prometheus")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files or []],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"prometheus not ready in 120 s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        """GET /api/v1/<path>; the JSON answer, errors included (status "error")."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                doc: dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read() or b"{}")
            doc.setdefault("status", "error")
        return doc

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        return self.api("query", **params)

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)

    def targets_up(self, job: str) -> list[str]:
        doc = self.api("targets", state="active")
        return [
            t["scrapeUrl"]
            for t in doc["data"]["activeTargets"]
            if t["labels"].get("job") == job and t["health"] == "up"
        ]
