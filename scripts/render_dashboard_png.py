"""Draw the dashboard's panels from the range results of a real run (matplotlib).

tests/integration/test_prometheus.py evaluates every panel query of the Grafana dashboard
against a real Prometheus and, with PACKRAT_DASHBOARD_DATA=<file>, writes the results there;
this script draws them, one subplot per panel, as a preview of what the dashboard shows:

    PACKRAT_DASHBOARD_DATA=/tmp/dash.json .venv/bin/pytest tests/integration/test_prometheus.py
    .venv/bin/python scripts/render_dashboard_png.py /tmp/dash.json \\
        -o helm/packrat-operator/dashboards/packrat-dashboard.png
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
OUT = ROOT / "helm" / "packrat-operator" / "dashboards" / "packrat-dashboard.png"


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="PACKRAT_DASHBOARD_DATA file of a test run")
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("render_dashboard_png: matplotlib is not installed", file=sys.stderr)
        return 2
    doc: dict[str, Any] = json.loads(args.data.read_text())
    start = float(doc["start"])
    panels: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for target in doc["panels"]:
        panels[target["panel"]].append(target)
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, (title, targets) in zip(axes.flat, panels.items(), strict=False):
        for target in targets:
            for series in target["result"][:8]:
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                points = [(t, v) for t, v in points if math.isfinite(v)]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, linewidth=1, label=_legend(target["legend"], series["metric"]))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        "Packrat dashboard panels: the dashboard's own queries over a real run "
        "(tests/integration/test_prometheus.py)",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=80)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
