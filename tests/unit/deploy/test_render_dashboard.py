"""scripts/render_dashboard_png.py: every panel of the shipped dashboard drawn from a data file
shaped as the Prometheus test writes it; bad input gives one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging_support import CHART_DIR, load_script

DASHBOARD = CHART_DIR / "dashboards" / "packrat.json"


def _data(dashboard: dict[str, Any], *, drop: str | None = None) -> dict[str, Any]:
    """One series of 30 one-second points per target (what query_range answers)."""
    targets = [
        {
            "panel": panel["title"],
            "legend": target["legendFormat"],
            "expr": target["expr"],
            "result": [
                {
                    "metric": {"namespace": "ns", "model": "tiny", "code": "200"},
                    "values": [[1000 + i, str(i * 0.5)] for i in range(30)],
                }
            ],
        }
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if panel["title"] != drop
    ]
    return {"start": 1000, "end": 1030, "panels": targets}


def test_every_panel_is_drawn(tmp_path: Path) -> None:
    gen = load_script("render_dashboard_png")
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    doc = _data(dashboard)
    (tmp_path / "data.json").write_text(json.dumps(doc))
    out = tmp_path / "dash.png"
    assert gen.main([str(tmp_path / "data.json"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    units = gen.panel_units(dashboard)
    assert len(units) >= 10 and set(units.values()) <= set(gen.UNITS)
    assert gen.render(doc, dashboard, tmp_path / "again.png") == len(doc["panels"])
    assert list(units) == [p["title"] for p in dashboard["panels"] if p["type"] != "row"]


@pytest.mark.parametrize("case", ["missing", "not-json", "not-data", "other-dashboard"])
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = load_script("render_dashboard_png")
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    path = tmp_path / "data.json"
    if case == "not-json":
        path.write_text("{")
    elif case == "not-data":
        path.write_text(json.dumps({"panels": "x"}))
    elif case == "other-dashboard":
        first = next(p["title"] for p in dashboard["panels"] if p.get("targets"))
        path.write_text(json.dumps(_data(dashboard, drop=first)))
    assert gen.main([str(path), "-o", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("render_dashboard_png: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out.png").exists()
