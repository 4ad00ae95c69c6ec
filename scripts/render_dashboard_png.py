"""Draw the dashboard's panels from the range results of a real run (matplotlib).

tests/integration/test_prometheus.py evaluates every panel query of the Grafana dashboard
against a real Prometheus (range API, 1 s steps) over a short real run of the operator and its
serving pods and, with PACKRAT_DASHBOARD_DATA=<file>, writes the results there; this script
draws them in the dashboard's order, one subplot per panel with the panel's unit, as a preview
of what the dashboard shows. `make dashboard-png` does both:

    PACKRAT_DASHBOARD_DATA=/tmp/dash.json .venv/bin/pytest tests/integration/test_prometheus.py
    .venv/bin/python scripts/render_dashboard_png.py /tmp/dash.json \\
        -o helm/packrat-operator/dashboards/packrat.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "helm" / "packrat-operator" / "dashboards" / "packrat.json"
OUT = DASHBOARD.with_suffix(".png")
MAX_SERIES = 8  # per target, as a legend stays readable
# Grafana unit ids the dashboard uses -> (axis label, scale)
UNITS = {
    "s": ("seconds", 1.0),
    "reqps": ("requests/s", 1.0),
    "percentunit": ("percent", 100.0),
    "short": ("", 1.0),
}


class DataError(Exception):
    """The data file is missing, unreadable or not what the Prometheus test writes."""


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template).strip()


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("panels"), list) or "start" not in doc:
        raise DataError(f"{path} has no start and panels: not a PACKRAT_DASHBOARD_DATA file")
    return doc


def panel_units(dashboard: dict[str, Any]) -> dict[str, str]:
    """Title -> Grafana unit of every timeseries panel, in the dashboard's order."""
    return {
        p["title"]: str(p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short"))
        for p in dashboard["panels"]
        if p.get("type") != "row"
    }


def render(doc: dict[str, Any], dashboard: dict[str, Any], output: Path) -> int:
    """Draw every panel of ``dashboard`` from ``doc``; the number of series drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = float(doc["start"])
    targets: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for target in doc["panels"]:
        targets[target["panel"]].append(target)
    units = panel_units(dashboard)
    missing = [t for t in units if t not in targets]
    if missing:
        raise DataError(f"no data for panel(s) {missing}: the data file is from another dashboard")
    cols = 3
    rows = math.ceil(len(units) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    seconds = float(doc.get("end", start)) - start
    drawn = 0
    for ax, (title, unit) in zip(axes.flat, units.items(), strict=False):
        label, scale = UNITS.get(unit, (unit, 1.0))
        for target in targets[title]:
            for series in target["result"][:MAX_SERIES]:
                points = [(float(t) - start, float(v) * scale) for t, v in series["values"]]
                points = [(t, v) for t, v in points if math.isfinite(v)]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(
                        xs,
                        ys,
                        linewidth=1,
                        marker="o" if len(xs) < 30 else None,  # a series of a few samples
                        markersize=3,
                        label=_legend(target["legend"], series["metric"]),
                    )
                    drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, max(seconds, 1.0))  # one time axis for every panel, as in Grafana
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(units) :]:
        ax.axis("off")
    fig.suptitle(
        f"Packrat dashboard: its own queries over a {seconds:.0f} s real run "
        "(operator, serving pods and a real Prometheus; tests/integration/test_prometheus.py)",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=80)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("data", type=Path, help="PACKRAT_DASHBOARD_DATA file of a test run")
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD, help="Grafana JSON")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("render_dashboard_png: matplotlib is not installed", file=sys.stderr)
        return 2
    try:
        doc = load(args.data)
        dashboard = json.loads(args.dashboard.read_text(encoding="utf-8"))
        drawn = render(doc, dashboard, args.output)
    except (DataError, OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        print(f"render_dashboard_png: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({drawn} series)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
