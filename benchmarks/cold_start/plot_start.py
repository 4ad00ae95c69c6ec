"""Plot one instance count's pod start by mode from cold_start.py's results (issue 14).

The median seconds to ready with the runs' range, and where the start's phases fall:

    python benchmarks/cold_start/plot_start.py \
        benchmarks/results/cold-start-resnet50-n2-before-after.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does a serving pod take to start, and how much memory does it hold?"'
    " (#how-long-does-a-serving-pod-take-to-start-and-how-much-memory-does-it-hold)"
)

MODE_ORDER = ["before", "private", "shared", "zygote"]
PHASES = (
    ("listening", "dispatcher listening"),
    ("frontend_up", "TorchServe up"),
    ("zygote_ready", "zygote ready"),
)


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    modes: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        modes.setdefault(r["mode"], []).append(r)
    out = {}
    for mode in sorted(modes, key=MODE_ORDER.index):
        rs = modes[mode]
        ready = [r["ready_s"] for r in rs]
        out[mode] = {
            "ready": ready,
            "median": statistics.median(ready),
            "pss": statistics.median(r["memory"]["pss_mb"] for r in rs),
            "p50": statistics.median(r["latency_ms"]["p50"] for r in rs),
            "phases": {
                key: statistics.median(r["phases"][key] for r in rs)
                for key, _ in PHASES
                if all(key in r["phases"] for r in rs)
            },
        }
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    base = summary.get("before", next(iter(summary.values())))["median"]
    lines = [
        "| mode | runs | ready s, median [range] | vs before | pod PSS MB | p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for mode, s in summary.items():
        lo, hi = min(s["ready"]), max(s["ready"])
        lines.append(
            f"| {mode} | {len(s['ready'])} | {s['median']:.2f} [{lo:.2f}-{hi:.2f}] | "
            f"{base / s['median']:.2f}x | {s['pss']:.0f} | {s['p50']:.1f} |"
        )
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 3.6))
    modes = list(summary)
    for y, mode in enumerate(modes):
        s = summary[mode]
        ax.barh(y, s["median"], color="#9ecae1")
        ax.plot(s["ready"], [y] * len(s["ready"]), "k|", markersize=14)
        for (key, label), marker in zip(PHASES, "o^s", strict=True):
            if key in s["phases"]:
                ax.plot(
                    s["phases"][key],
                    y,
                    marker,
                    color="#08519c",
                    label=label if y == len(modes) - 1 else None,
                )
        ax.text(max(s["ready"]) + 0.08, y, f"{s['median']:.2f} s", va="center")
    ax.set_yticks(range(len(modes)), modes)
    ax.set_xlabel("seconds from spawning packrat serve (bars: median ready; ticks: each run)")
    ax.set_title(title)
    ax.set_xlim(0, max(max(s["ready"]) for s in summary.values()) + 0.7)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE)
    parser.add_argument("result", type=Path, help="cold_start.py's JSON file")
    path: Path = parser.parse_args().result
    data = json.loads(path.read_text())
    counts = {r["instances"] for r in data["results"]}
    summary = summarize(data["results"])
    png = path.with_suffix(".png")
    plot(
        summary,
        png,
        f"{data.get('model', '?')}, {'/'.join(map(str, sorted(counts)))} instances: pod start",
    )
    print(table(summary))
    print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
