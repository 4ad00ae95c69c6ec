"""The results of ``packrat bench --serving`` (:mod:`packrat.bench.serving`): each run's batch
latencies, the summary over interleaved repetitions, and the table printed for it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from packrat.plan.baselines import FAT, PER_CORE

PACKRAT = "packrat"
TORCHSERVE = "torchserve"
CONFIGS = (PACKRAT, FAT, TORCHSERVE, PER_CORE)
MIN_BURSTS = 8


@dataclass
class Run:
    config: str
    batch: int
    repeat: int
    label: str
    batch_latencies_ms: list[float]
    errors: int

    @property
    def median_ms(self) -> float:
        return statistics.median(self.batch_latencies_ms)


@dataclass
class BenchResult:
    settings: dict[str, Any]
    cpus: list[int]
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def medians(self, config: str, batch: int) -> list[float]:
        return [r.median_ms for r in self.runs if r.config == config and r.batch == batch]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"settings": self.settings, "cpus": self.cpus, "batches": {}}
        for batch, plan in self.plans.items():
            row: dict[str, Any] = {"plan": plan, "configs": {}}
            for config in CONFIGS:
                values = self.medians(config, batch)
                if not values:
                    continue
                labels = {r.label for r in self.runs if r.config == config and r.batch == batch}
                row["configs"][config] = {
                    "label": ",".join(sorted(labels)),
                    "median_ms": statistics.median(values),
                    "min_ms": min(values),
                    "max_ms": max(values),
                    "runs_ms": values,
                    "errors": sum(
                        r.errors for r in self.runs if r.config == config and r.batch == batch
                    ),
                }
            ours = row["configs"].get("packrat", {}).get("median_ms")
            row["speedup"] = {
                c: row["configs"][c]["median_ms"] / ours
                for c in (FAT, TORCHSERVE, PER_CORE)
                if ours and c in row["configs"]
            }
            row["expected_speedup"] = {
                FAT: plan.get("expected_speedup"),
                PER_CORE: plan.get("expected_speedup_per_core"),
            }
            out["batches"][batch] = row
        return out


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        f"serving benchmark: model {summary['settings']['model']}, cpus "
        f"{','.join(map(str, summary['cpus']))}, {summary['settings']['repeats']} interleaved "
        f"repetitions x ~{summary['settings']['requests']} requests (bursts of B, at least "
        f"{MIN_BURSTS} bursts, after 1 warm-up burst); batch latency in ms "
        "(median over repetitions of each run's median, [min..max] of the run medians)",
        "",
    ]
    header = f"{'B':>4}  {'config':<11}{'instances':<22}{'median':>9}  {'spread':<19}{'errors':>6}"
    lines.append(header)
    for batch, row in summary["batches"].items():
        for config, c in row["configs"].items():
            lines.append(
                f"{batch:>4}  {config:<11}{c['label']:<22}{c['median_ms']:9.1f}  "
                f"[{c['min_ms']:.1f}..{c['max_ms']:.1f}]".ljust(66)
                + f"{c['errors']:>6}"
            )
        sp = row["speedup"]
        ex = row["expected_speedup"]
        parts = [f"{k} {v:.2f}x" for k, v in sp.items()]
        exp = [f"{k} {v:.2f}x" for k, v in ex.items() if v]
        lines.append(f"{'':6}speedup of packrat over: {', '.join(parts)}")
        lines.append(f"{'':6}expected (optimizer):    {', '.join(exp) or 'n/a'}")
        lines.append("")
    return "\n".join(lines)
