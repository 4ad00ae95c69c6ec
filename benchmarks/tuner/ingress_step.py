"""A downstream stage tuned from the pipeline's ingress vs from its own arrivals, in
simulation (issue 27 item 5): how much earlier stage B of a chain A -> B scales on a 4x step.

The chain: every query A answers goes on to B, or the share ``f`` of them, thinned evenly
(:func:`packrat.plan.pipeline.feedback.thin`, the operator's rule). Both stages run ResNet-50's
TorchServe profile; each is planned on its own sample (B's: the sample thinned to ``f``) for
half the end-to-end SLO ``--slo-ms``. The evaluation trace at the ingress: the base rate, then
4x, 120 s each. Stage A is tuned from the ingress (a root stage's own arrivals) with start-up
headroom, and a scale-up serves ``--startup-s`` later, as in ``startup_step.py``; the DES runs
A's replica schedule; A's departures (thinned to ``f``) are B's arrivals. B's tuner is the same
in both variants (start-up headroom, the same plan and sample), only what it reads differs:

- ``own``: B's own arrivals (A's departures, thinned): what B's pods record;
- ``ingress``: the ingress thinned to ``f`` (``spec.autoscaling.ingress``): what the router
  records, before A has answered;
- ``max``: two tuners, one on each, B scaled to the more replicas either wants (not the
  operator's rule: what reading both would give).

Per variant: B's first scale-up decision after the step (s after it), B's misses (its own
latency over its half of the SLO), end-to-end misses and P99 (A's latency plus B's for the
queries that reach B, a shed query a miss), B's mean cores (replica-seconds x cpus over the
trace) and its core-seconds (serving replicas x cpus) in the 10 s and the minute after the
step; each run's decided schedules are in the JSON. Scenarios, each on the same traces
for both variants, seeds interleaved:

- ``both planned for the base rate``: A is backlogged while its new replicas start
  (``--startup-s``), so its departures, B's own arrivals, stay at A's capacity until they
  serve;
- ``both planned for the base rate, no start-up``: the same with ``startup_s`` 0: A's
  backlog lasts about one decision interval;
- ``A planned for the peak, B for the base rate``: A is planned on a sample that has the
  step, so it is never backlogged and its departures follow the ingress within milliseconds;
  B must still scale.

Each for every share in ``--fractions`` (1 and 0.5).

Run: ``.venv/bin/python benchmarks/tuner/ingress_step.py`` (three minutes); writes
``benchmarks/results/ingress-step.{json,txt}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from packrat.plan.des import simulate
from packrat.plan.envelope import Tuner, envelope, growth_within, replay, schedule, window_sizes
from packrat.plan.pipeline.feedback import thin
from packrat.plan.profile import load_profile
from packrat.plan.provision import Planner, provision
from packrat.plan.traces import gamma_trace, step_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Does a downstream stage scale sooner when tuned from the ingress?"'
    " (#does-a-downstream-stage-scale-sooner-when-tuned-from-the-ingress)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"
STEP_S = 120.0
VARIANTS = ("own", "ingress", "max")


class Stage:
    """One stage's plan and tuner settings, made from its sample."""

    def __init__(self, table: dict, sample: np.ndarray, slo_ms: float, args: Any) -> None:
        self.table = table
        self.prov = provision(Planner(table, sample, slo_ms=slo_ms, max_cores=args.max_cores))
        self.planner = Planner(table, sample, slo_ms=slo_ms, max_cores=args.max_cores)
        self.sample = sample
        self.startup_s = args.startup_s

    @property
    def cpus(self) -> int:
        return int(self.prov.best.config.cpus)

    def tuner(self) -> Tuner:
        cfg, sample = self.prov.best.config, self.sample
        windows = window_sizes(self.prov.plan.expected_latency_ms / 1000.0, min_window_s=0.1)
        return Tuner(
            planned_replicas=cfg.replicas,
            replica_capacity=self.planner.capacity(self.prov.best.instances),
            windows=windows,
            planned_rates=envelope(sample, [min(w, float(sample[-1])) for w in windows]).tolist(),
            max_replicas=self.planner.max_cores // cfg.cpus,
            scale_down_delay_s=60.0,
            noise_z=3.0,
            startup_s=self.startup_s,
            growth=growth_within(sample, self.startup_s + 1.0, noise_z=1.0),
        )

    def run(self, seen: list[np.ndarray], arrivals: np.ndarray, end: float) -> dict[str, Any]:
        """Tune on each of ``seen`` (one tuner each, the most replicas any wants), serve
        ``arrivals``: the decided and serving schedules and each arrival's latency (ms, inf:
        shed)."""
        runs = [replay(self.tuner(), s, interval_s=1.0, until_s=end) for s in seen]
        decisions = [
            replace(ds[0], replicas=max(d.replicas for d in ds)) for ds in zip(*runs, strict=True)
        ]
        decided = schedule(decisions, initial=self.prov.best.config.replicas)
        serving = [decided[0]]
        for (t, n), (_, prev) in zip(decided[1:], decided, strict=False):
            serving.append((t + self.startup_s, n) if n > prev else (t, n))
        serving.sort()
        res = simulate(arrivals, self.table, self.prov.best.instances, schedule=serving)
        return {"decided": decided, "serving": serving, "latency_ms": res.latencies_ms}


def core_seconds(steps: list[tuple[float, int]], cpus: int, t0: float, t1: float) -> float:
    total = 0.0
    for (t, n), nxt in zip(steps, [*steps[1:], (t1, 0)], strict=False):
        total += n * max(0.0, min(nxt[0], t1) - max(t, t0))
    return total * cpus


def first_up(steps: list[tuple[float, int]], after: float) -> float | None:
    base = max(n for t, n in steps if t <= after)
    return next((t - after for t, n in steps if t > after and n > base), None)


def chain(args: Any, stages: tuple[Stage, Stage], trace: np.ndarray) -> dict[str, Any]:
    """A on the ingress ``trace``, then B in both variants on the same A departures."""
    a, b = stages
    end = float(trace[-1])
    ra = a.run([trace], trace, end)
    lat_a = ra["latency_ms"]
    depart = trace + lat_a / 1000.0
    answered = np.flatnonzero(np.isfinite(depart))
    order = answered[np.argsort(depart[answered], kind="stable")]
    # the share f of A's answers goes on to B, evenly in the order A answers them
    keep = np.array(thin(list(range(order.size)), args.fraction), dtype=np.int64)
    to_b = order[keep] if keep.size else keep
    arrivals_b = depart[to_b]
    backlog = float(np.max(lat_a[np.isfinite(lat_a)]))
    out: dict[str, Any] = {
        "a_first_up_s": first_up(ra["decided"], STEP_S),
        "a_max_latency_ms": backlog,
        "a_shed": int(np.sum(~np.isfinite(lat_a))),
        "variants": {},
    }
    ingress = np.asarray(thin(trace.tolist(), args.fraction))
    seen = {"own": [arrivals_b], "ingress": [ingress], "max": [arrivals_b, ingress]}
    for name in VARIANTS:
        rb = b.run(seen[name], arrivals_b, end)
        e2e = lat_a.copy()
        e2e[to_b] += rb["latency_ms"]
        lat_b = rb["latency_ms"]
        out["variants"][name] = {
            "b_first_up_s": first_up(rb["decided"], STEP_S),
            "b_miss_pct": 100.0 * float(np.mean(~(lat_b <= args.slo_ms / 2))),
            "e2e_miss_pct": 100.0 * float(np.mean(~(e2e <= args.slo_ms))),
            "e2e_p99_ms": float(np.percentile(e2e, 99, method="inverted_cdf")),
            "b_cores": core_seconds(rb["serving"], b.cpus, 0.0, end) / end,
            "b_core_s_10": core_seconds(rb["serving"], b.cpus, STEP_S, STEP_S + 10.0),
            "b_core_s_60": core_seconds(rb["serving"], b.cpus, STEP_S, STEP_S + 60.0),
            "b_schedule": rb["decided"],
        }
    return out


def summary(values: list[float | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "none": len(values)}
    return {
        "median": statistics.median(known),
        "min": min(known),
        "max": max(known),
        "none": len(values) - len(known),
    }


def scenario(table: dict, name: str, args: Any, f: float, startup_s: float, a_peak: bool) -> dict:
    """Both stages planned on the base rate's sample, or A on a sample that has the step
    (``a_peak``: planned for the peak, never backlogged), B on the base rate's still."""
    r = args.rate
    sub = argparse.Namespace(**{**vars(args), "startup_s": startup_s, "fraction": f})
    steady = gamma_trace(r, cv=1.0, duration_s=60, seed=30)
    sample_a = step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=41) if a_peak else steady
    stages = (
        Stage(table, sample_a, args.slo_ms / 2, sub),
        Stage(table, np.asarray(thin(steady.tolist(), f)), args.slo_ms / 2, sub),
    )
    runs = [
        chain(sub, stages, step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=seed))
        for seed in args.seeds
    ]
    rows: dict[str, Any] = {}
    for v in VARIANTS:
        keys = [k for k in runs[0]["variants"][v] if k != "b_schedule"]
        rows[v] = {k: summary([run["variants"][v][k] for run in runs]) for k in keys}
    return {
        "scenario": name,
        "fraction": f,
        "startup_s": startup_s,
        "plans": [s.prov.best.config.label for s in stages],
        "a_first_up_s": summary([run["a_first_up_s"] for run in runs]),
        "a_max_latency_ms": summary([run["a_max_latency_ms"] for run in runs]),
        "rows": rows,
        "runs": runs,
    }


def fmt(s: dict[str, Any], spec: str = ".1f") -> str:
    if s["median"] is None:
        return "never"
    text = f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"
    return text + (f" [{s['none']} never]" if s["none"] else "")


def report(args: Any, out: list[dict]) -> str:
    lines = [
        f"chain A -> B (fractions {args.fractions}), ingress 4x step from {args.rate:g}/s at "
        f"{STEP_S:g} s, end-to-end SLO {args.slo_ms:g} ms (each stage planned for half), "
        f"{PROFILE.name}, seeds {args.seeds}; median (min-max); load average "
        f"{os.getloadavg()[0]:.2f}",
    ]
    for sc in out:
        lines += [
            "",
            f"{sc['scenario']}, fraction {sc['fraction']:g} (start-up {sc['startup_s']:g} s): "
            f"plans A {sc['plans'][0]}, B {sc['plans'][1]}; A's first scale-up after the step "
            f"(s): {fmt(sc['a_first_up_s'])}, A's worst latency "
            f"{fmt(sc['a_max_latency_ms'], '.0f')} ms",
            f"  {'B tuned from':14}{'B first up (s)':>22}{'B misses %':>24}{'e2e misses %':>24}"
            f"{'e2e P99 ms':>26}{'B cores':>22}{'B core-s +10 s':>22}{'+60 s':>22}",
        ]
        for v, row in sc["rows"].items():
            lines.append(
                f"  {v:14}{fmt(row['b_first_up_s']):>22}{fmt(row['b_miss_pct'], '.2f'):>24}"
                f"{fmt(row['e2e_miss_pct'], '.2f'):>24}{fmt(row['e2e_p99_ms'], '.0f'):>26}"
                f"{fmt(row['b_cores']):>22}{fmt(row['b_core_s_10'], '.0f'):>22}"
                f"{fmt(row['b_core_s_60'], '.0f'):>22}"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="base rate (x4 after the step)")
    parser.add_argument(
        "--fractions", type=float, nargs="+", default=[1.0, 0.5], help="shares of A's answers to B"
    )
    parser.add_argument("--slo-ms", type=float, default=1000.0, help="end-to-end SLO")
    parser.add_argument("--startup-s", type=float, default=5.0)
    parser.add_argument("--max-cores", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[31, 32, 33])
    parser.add_argument("--stem", default="ingress-step")
    args = parser.parse_args()
    table = dict(load_profile(PROFILE).table())
    out = [
        scenario(table, name, args, f, startup_s, a_peak)
        for f in args.fractions
        for name, startup_s, a_peak in (
            ("both planned for the base rate", args.startup_s, False),
            ("both planned for the base rate, no start-up", 0.0, False),
            ("A planned for the peak, B for the base rate", args.startup_s, True),
        )
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(
        json.dumps({"args": vars(args), "results": out}, indent=1, default=float) + "\n"
    )
    text = report(args, out)
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
