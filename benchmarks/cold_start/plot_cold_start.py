"""Plot and tabulate cold_start.py's results: a PNG and markdown tables (issue 14).

    python benchmarks/cold_start/plot_cold_start.py \
        benchmarks/results/cold-start-resnet50.json
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

KINDS = ("dispatcher", "jvm", "zygote", "launcher", "worker", "other")
MODE_ORDER = ["before", "private", "shared", "zygote"]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 else "-"


def summarize(results: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(
            (r.get("mode", "shared" if r["shared"] else "private"), r["instances"]), []
        ).append(r)
    out = {}
    for key, rs in groups.items():
        kinds = {
            k: _median([r["memory"]["kinds"].get(k, {}).get("pss_mb", 0.0) for r in rs])
            for k in KINDS
        }
        out[key] = {
            "runs": len(rs),
            "ready": [r["ready_s"] for r in rs],
            "frontend": [r["phases"].get("frontend_up", float("nan")) for r in rs],
            "pss": [r["memory"]["pss_mb"] for r in rs],
            "rss": [r["memory"]["rss_mb"] for r in rs],
            "p50": [r["latency_ms"]["p50"] for r in rs],
            "kinds": kinds,
        }
    return out


def tables(summary: dict[tuple[str, int], dict[str, Any]]) -> str:
    modes = sorted({m for m, _ in summary}, key=MODE_ORDER.index)
    counts = sorted({n for _, n in summary})
    lines = [
        "| mode | instances | runs | pod PSS MB | vs 1 instance (same mode) | vs 1 private | "
        "pod RSS MB | "
        "dispatcher / JVM / zygote / launchers / workers PSS MB | ready s [range] | "
        "ready - frontend up s | p50 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = summary.get(("private", 1))
    for mode in modes:
        one = summary.get((mode, 1))
        for n in counts:
            s = summary.get((mode, n))
            if s is None:
                continue
            pss = _median(s["pss"])
            ratio = f"{pss / _median(one['pss']):.2f}x" if one else "-"
            vs_base = f"{pss / _median(base['pss']):.2f}x" if base else "-"
            k = s["kinds"]
            parts = " / ".join(
                f"{k[x]:.0f}" for x in ("dispatcher", "jvm", "zygote", "launcher", "worker")
            )
            after = [r - f for r, f in zip(s["ready"], s["frontend"], strict=True)]
            lines.append(
                f"| {mode} | {n} | {s['runs']} | {pss:.0f} | {ratio} | {vs_base} | "
                f"{_median(s['rss']):.0f} | "
                f"{parts} | {_median(s['ready']):.1f} [{_spread(s['ready'])}] | "
                f"{_median(after):.1f} | {_median(s['p50']):.0f} |"
            )
    return "\n".join(lines)


def plot(summary: dict[tuple[str, int], dict[str, Any]], png: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({m for m, _ in summary}, key=MODE_ORDER.index)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in modes:
        ns = sorted(n for m, n in summary if m == mode)
        ax1.plot(ns, [_median(summary[(mode, n)]["pss"]) for n in ns], "o-", label=mode)
        ax2.plot(
            ns,
            [
                _median(
                    [
                        r - f
                        for r, f in zip(
                            summary[(mode, n)]["ready"], summary[(mode, n)]["frontend"], strict=True
                        )
                    ]
                )
                for n in ns
            ],
            "o-",
            label=mode,
        )
    one = summary.get(("private", 1)) or next(iter(summary.values()))
    ns = sorted({n for _, n in summary})
    ax1.plot(ns, [2 * _median(one["pss"])] * len(ns), "k:", label="2x one private instance")
    ax1.set(xlabel="instances", ylabel="pod PSS (MB)", title=f"{model}: memory of the whole pod")
    ax2.set(
        xlabel="instances",
        ylabel="s from TorchServe up to ready",
        title="instances' start (load + warm-up)",
    )
    for ax in (ax1, ax2):
        ax.set_xticks(ns)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    """One or more result files (merged: e.g. the 1-instance and the 8-instance runs); the
    plot goes next to the first, or to ``--png PATH``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE)
    parser.add_argument("results", nargs="+", type=Path, help="cold_start.py's JSON files")
    parser.add_argument("--png", type=Path, help="where the plot goes (next to the first)")
    args = parser.parse_args()
    paths: list[Path] = args.results
    png_arg: Path | None = args.png
    datas = [json.loads(p.read_text()) for p in paths]
    summary = summarize([r for d in datas for r in d["results"]])
    png = png_arg or paths[0].with_suffix(".png")
    plot(summary, png, datas[0].get("model", "?"))
    print(tables(summary))
    print(f"\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
