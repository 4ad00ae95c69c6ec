"""Plan and replicas adapting together on a 4x step load, in simulation (issue 27 item 4).

The planner plans on a sample trace (ResNet-50's TorchServe profile, SLO ``--slo-ms``); on
the evaluation trace (base rate, then 4x, 120 s each) the tuner decides replicas every
second with start-up headroom (a scale-up serves ``--startup-s`` later, as in
``startup_step.py``), and the plan inside a replica either stays the planner's (``fixed``)
or follows the pods' batch-size estimate as autoBatch does, with the slow rules (3
observations read 5 s apart, 60 s between switches: the operator's defaults) or the fast
trigger (``sustainSeconds`` 1: the estimate read every second, and again when a new one will
have held long enough (:func:`packrat.plan.reconfig.fast_due`, plus 50 ms, as the operator
does), a switch once every pod's estimate has held a new value 1 s, 2 s for a neighbouring
batch; :func:`packrat.plan.reconfig.fast_trigger`), and the fast
trigger with autoBatch's range floored at the planner's batch (``joint-fast-floor``). A switch
serves ``--switch-s`` later (the in-pod switch) and tells the tuner the new plan's capacity;
the ``-floor-keep`` variants are the operator's rule since the last stop: the range floored at
the planner's batch and the tuner counting on no more per replica than the planned plan
serves; ``-cap`` also caps the range at the batch whose optimal plan serves the most
backlogged among those expected within the SLO (:func:`packrat.plan.reconfig.slo_ceiling`,
the operator's rule since this stop: a batch whose plan alone takes longer than the SLO
misses it for every query it holds, and beyond the one that serves the most a larger batch
serves fewer). A third evaluation trace has no step (the base rate for 240 s): what the
rules do on a steady load (switches).

The pods' estimate is Packrat's estimator (:class:`packrat.plan.estimator.BatchSizeEstimator`,
nearest rounding) fed every 5 ms with the outstanding queries per serving replica, counted
from the simulation up to that moment. Batch timeouts are not modelled (the DES does not
report them), so only the sustained-change trigger is exercised.

How a plan switch is simulated: the trace is cut into the spans each plan served, and each
span is simulated replica by replica (the DES's replicas share nothing; each arrival goes to
a replica serving at its time, from its own uniform draw, the same for every variant, as
kube-proxy's random spread does) in order, so a query keeps its replica and the backlog a
plan leaves is the one the simulation built. At a switch the queries still unanswered
(``--switch-model``): ``share`` (the default, as the dispatcher's swap does) finish on the
old plan while the new one takes the new arrivals, every batch of both lasting twice its
profiled time until the old set is idle (two instance sets on the pod's cores); ``carry``
re-enter the new plan's queue first, in arrival order (the cores serve the backlog once at
the new plan's speed, and new arrivals wait behind it: pessimistic for them); ``drain``
finish on the old plan at full speed beside the new one (optimistic: it doubles the pod's
cores while the old set drains). In each, a batch running at the switch is served again
(slightly pessimistic). Until this stop each plan's span was simulated afresh from 10 s
before it, so a switch taken while a backlog was queued dropped the part of it built
earlier than that: a later switch (the slow rules) forgot more of the surge's backlog than
an early one (the fast trigger) and looked better than it was.
The first seed's per-second arrivals, misses, outstanding queries, replicas and batch
around the step (100-220 s) of ``fixed`` and the ``-floor-keep`` variants go to
``{stem}-timeline.csv``.

Run: ``.venv/bin/python benchmarks/tuner/joint_step.py`` (a few minutes); writes
``benchmarks/results/joint-step.{json,txt}`` and ``joint-step-timeline.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packrat.plan.des import simulate
from packrat.plan.envelope import Tuner, envelope, growth_within, window_sizes
from packrat.plan.estimator import BatchSizeEstimator
from packrat.plan.optimizer import Optimizer, Plan
from packrat.plan.profile import load_profile
from packrat.plan.provision import Planner, backlogged_capacity, provision
from packrat.plan.reconfig import (
    FastLook,
    FastPolicy,
    FastState,
    Observation,
    Policy,
    decide,
    fast_due,
    fast_trigger,
    slo_ceiling,
)
from packrat.plan.traces import gamma_trace, step_trace

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the tuner follow a load step?"'
    " (#how-does-the-tuner-follow-a-load-step)"
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "resnet-torchserve.csv"
RESULTS = ROOT / "benchmarks" / "results"
SAMPLE_S = 0.005
DUE_MARGIN_S = 0.05  # the operator's read when a new estimate is due (batching.FAST_DUE_MARGIN)
TIMELINE = ("arrivals", "miss_pct", "outstanding", "replicas", "batch")
TIMELINE_VARIANTS = (
    "fixed", "joint-slow-floor-keep", "joint-fast-floor-keep", "joint-fast-floor-keep-cap",
)  # fmt: skip
VARIANTS = (
    "fixed", "joint-slow", "joint-fast", "joint-fast-floor",
    "joint-slow-floor-keep", "joint-fast-floor-keep",
    "joint-slow-floor-keep-cap", "joint-fast-floor-keep-cap",
)  # fmt: skip


@dataclass
class Run:
    """One variant's state over the evaluation trace."""

    plan: Plan
    replicas: list[tuple[float, int]]  # (time, serving replicas), scale-ups delayed
    segments: list[tuple[float, Plan]] = field(default_factory=list)
    history: list[Observation] = field(default_factory=list)
    fast: FastState = field(default_factory=FastState)
    last_switch: float | None = None
    done: np.ndarray = field(default_factory=lambda: np.empty(0))  # completion (s) per query
    final: int = 0  # segments simulated for good (their successor has begun)
    carried: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


@dataclass(frozen=True)
class Chain:
    """What every segment's simulation shares: the trace, each arrival's draw for the
    Service's random spread (the same for every variant), the profile and the switch model."""

    trace: np.ndarray
    pick: np.ndarray
    table: dict
    switch: str


def serving_at(steps: list[tuple[float, int]], t: float) -> int:
    n = steps[0][1]
    for when, count in steps:
        if when <= t:
            n = count
    return n


def replica_of(chain: Chain, steps: list[tuple[float, int]], idx: np.ndarray) -> np.ndarray:
    """The replica each arrival goes to: one of those serving at its time, uniformly (kube-
    proxy's random spread), from the arrival's own draw."""
    when = np.array([t for t, _ in steps])
    count = np.array([n for _, n in steps])
    active = count[np.searchsorted(when, chain.trace[idx], side="right") - 1]
    return np.minimum((chain.pick[idx] * active).astype(np.int64), active - 1)


def sim_segment(
    chain: Chain, plans: tuple[Plan, Plan], steps: list, span: tuple[float, float], carried: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals in ``span`` on ``plans[1]``, each replica simulated on its own (the DES's
    replicas share nothing), with the ``carried`` queries (unanswered at the span's start, in
    arrival order) that its replica holds as ``chain.switch`` says: (query indices,
    completion times in s)."""
    (t0, t1), (old, new) = span, plans
    a, b = np.searchsorted(chain.trace, [t0, t1])
    idx = np.concatenate([carried, np.arange(a, b)])
    if idx.size == 0:
        return idx, np.empty(0)
    rep = replica_of(chain, steps, idx)
    start = np.maximum(chain.trace[idx], t0)  # a carried query re-enters a queue at t0
    held = np.zeros(idx.size, dtype=bool)
    held[: carried.size] = True
    done = np.empty(idx.size)
    for r in np.unique(rep):
        mine = np.flatnonzero(rep == r)  # carried first, then arrivals: sorted times
        if chain.switch == "carry" or not held[mine].any():
            done[mine] = finish(chain, new, start[mine])
            continue
        back, fresh = mine[held[mine]], mine[~held[mine]]
        slow = 2.0 if chain.switch == "share" else 1.0  # two instance sets on the cores
        done[back] = finish(chain, old, start[back], slow)
        free = float(np.max(done[back], where=np.isfinite(done[back]), initial=t0))
        early = fresh[start[fresh] < free]  # served at ``slow`` while the old set drains
        done[early] = finish(chain, new, start[early], slow)
        late = np.concatenate([early[done[early] > free], fresh[start[fresh] >= free]])
        done[late] = finish(chain, new, np.maximum(start[late], free))
    return idx, done


def finish(chain: Chain, plan: Plan, start: np.ndarray, slow: float = 1.0) -> np.ndarray:
    """Completion times (s; inf: shed) of queries queued at ``start`` (sorted) on one replica
    of ``plan``, each batch ``slow`` times its profiled latency."""
    if start.size == 0:
        return start
    factors = None if slow == 1.0 else [slow]
    res = simulate(start, chain.table, plan.expand(), service_factors=factors)
    return start + res.latencies_ms / 1000.0


def simulate_upto(chain: Chain, run: Run, now: float) -> np.ndarray:
    """Every query that arrived before ``now``, through the plans that served it: a finished
    segment is simulated once, the current one up to ``now``; the queries a segment leaves
    unanswered are handed to the next as ``chain.switch`` says."""
    if run.done.size == 0:
        run.done = np.full(chain.trace.size, np.nan)
    bounds = [t for t, _ in run.segments[1:]] + [math.inf]
    while True:
        k = run.final
        t0, plan = run.segments[k]
        old = run.segments[k - 1][1] if k else plan
        span = (t0, min(bounds[k], now))
        idx, done = sim_segment(chain, (old, plan), run.replicas, span, run.carried)
        run.done[idx] = done
        if bounds[k] > now or k + 1 == len(run.segments):
            break
        run.final += 1
        late = idx[np.isfinite(done) & (done > bounds[k])]  # unanswered when the next begins
        run.carried = late[np.argsort(chain.trace[late], kind="stable")]
    n = int(np.searchsorted(chain.trace, now))
    return run.done[:n]


def outstanding(arr: np.ndarray, done: np.ndarray, times: np.ndarray) -> np.ndarray:
    ends = np.sort(np.where(np.isfinite(done), done, -np.inf))
    return np.searchsorted(arr, times, side="right") - np.searchsorted(ends, times, "right")


def run_variant(variant: str, chain: Chain, ctx: dict[str, Any]) -> dict:
    opt: Optimizer = ctx["opt"]
    tuner: Tuner = ctx["tuner"]()
    trace, table = chain.trace, chain.table
    startup_s, switch_s, end = ctx["startup_s"], ctx["switch_s"], float(trace[-1])
    floor = ctx["batch"] if "floor" in variant else 1  # never below the planner's
    top = ctx["max_batch"]
    if variant.endswith("-cap"):  # no batch whose optimal plan alone takes longer than the SLO
        top = slo_ceiling(
            opt.latency,
            slo_ms=ctx["slo_ms"],
            floor=floor,
            top=top,
            capacity=lambda b: backlogged_capacity(table, opt.plan(b).expand()),
        )
    policy = Policy(min_batch=floor, max_batch=top, sustain=3, min_interval_s=60.0)
    fast = FastPolicy(sustain_s=1.0, near_hold=ctx["near_hold"], min_interval_s=5.0)
    read_every = 1.0 if variant.startswith("joint-fast") else 5.0
    run = Run(plan=opt.plan(ctx["batch"]), replicas=[(0.0, ctx["replicas"])])
    run.segments.append((0.0, run.plan))
    est = BatchSizeEstimator(window=200, rounding="nearest")
    held = (est.estimate, 0.0)
    lo, now, switches, last_read = 0, 1.0, 0, 0.0
    while now <= end:
        hi = int(np.searchsorted(trace, now, side="right"))
        tuner.observe(trace[lo:hi].tolist())
        lo = hi
        d = tuner.decide(now)
        current = run.replicas[-1][1]
        if d.replicas != current:  # a scale-up serves after the start-up, a scale-down at once
            run.replicas.append((now + startup_s if d.replicas > current else now, d.replicas))
            run.replicas.sort()
        t = now  # the reads this second: on the second, and (the fast trigger) again when
        while variant != "fixed" and int(now) % int(read_every) == 0:  # a new estimate is due
            done = simulate_upto(chain, run, t)
            samples = np.arange(last_read, t, SAMPLE_S)
            last_read = t
            counts = outstanding(trace[: done.size], done, samples)
            for s, c in zip(samples, counts, strict=True):
                if c > 0:
                    est.observe(float(c) / max(1, serving_at(run.replicas, float(s))))
                    if est.estimate != held[0]:
                        held = (est.estimate, float(s))
            if step_plan(run, variant, opt, table, policy, fast, est, held, t):
                switches += 1  # the new plan serves after the switch; the tuner learns its
                cap = backlogged_capacity(table, run.plan.expand())  # capacity
                if "keep" in variant:  # the operator's rule: never more than planned
                    cap = min(cap, backlogged_capacity(table, opt.plan(ctx["batch"]).expand()))
                tuner.set_capacity(cap)
                run.segments[-1] = (t + switch_s, run.plan)
                break
            due = due_in(run, variant, policy, fast, est, held, t)
            if due is None or t + due + DUE_MARGIN_S >= now + 1.0:
                break
            t += due + DUE_MARGIN_S
        now += 1.0
    done = simulate_upto(chain, run, math.inf)
    lat = (done - trace) * 1000.0
    return {
        "misses": float((lat > ctx["slo_ms"]).mean()),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "cores": mean_level(run.replicas, end) * ctx["cpus"],
        "replica_changes": len(run.replicas) - 1,
        "plan_switches": switches,
        "plans": [(round(t, 1), p.label) for t, p in run.segments],
        "timeline": timeline(chain, run, lat, end, ctx["slo_ms"]),
    }


def timeline(
    chain: Chain, run: Run, lat: np.ndarray, end: float, slo_ms: float
) -> list[list[float]]:
    """Per second: arrivals, misses (%), queries outstanding at its start, serving replicas,
    the plan's batch."""
    sec = np.floor(chain.trace).astype(np.int64)
    rows = []
    for s in range(int(end) + 1):
        mine = lat[sec == s]
        queued = int(((chain.trace <= s) & (chain.trace + lat / 1000.0 > s)).sum())
        batch = [p.batch for t, p in run.segments if t <= s][-1]
        miss = 100.0 * float((mine > slo_ms).mean()) if mine.size else 0.0
        rows.append([s, int(mine.size), round(miss, 1), queued, serving_at(run.replicas, s), batch])
    return rows


def step_plan(
    run: Run,
    variant: str,
    opt: Optimizer,
    table: dict,
    policy: Policy,
    fast: FastPolicy,
    est: BatchSizeEstimator,
    held: tuple[int, float],
    now: float,
) -> bool:
    """One read of the estimate and autoBatch's decision; True when it switched the plan."""
    observed = policy.clamp(est.estimate)
    run.history.append(Observation(now, observed))
    history, pol, waive = run.history, policy, False
    if variant.startswith("joint-fast"):
        look = FastLook(observed=observed, stable_s=now - held[1], timeout_fraction=None)
        verdict = fast_trigger(
            fast=fast, policy=policy, current=run.plan.batch, look=look, state=run.fast, now=now
        )
        run.fast = verdict.state
        if verdict.fire:
            history, pol, waive = [Observation(now, observed)], replace(policy, sustain=1), True
    d = decide(
        policy=pol,
        current_plan=run.plan,
        table=table,
        optimal_latency=opt.latency,
        history=history,
        last_switch_at=run.last_switch,
        now=now,
        ignore_interval=waive,
    )
    if not d.switch or d.target is None:
        return False
    run.fast = FastState(armed=run.fast.armed, last_at=now, last_from=run.plan.batch)
    run.last_switch = now
    run.plan = opt.plan(d.target)
    run.segments.append((now, run.plan))
    return True


def due_in(
    run: Run,
    variant: str,
    policy: Policy,
    fast: FastPolicy,
    est: BatchSizeEstimator,
    held: tuple[int, float],
    now: float,
) -> float | None:
    """The fast trigger's variants: seconds until the estimate will have held long enough
    (the operator reads the pods again then, :func:`packrat.plan.reconfig.fast_due`)."""
    if not variant.startswith("joint-fast"):
        return None
    look = FastLook(
        observed=policy.clamp(est.estimate), stable_s=now - held[1], timeout_fraction=None
    )
    return fast_due(
        fast=fast, policy=policy, current=run.plan.batch, look=look, state=run.fast, now=now
    )


def mean_level(steps: list[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t, n), nxt in zip(steps, [*steps[1:], (end, 0)], strict=False):
        total += n * max(0.0, min(nxt[0], end) - min(t, end))
    return total / end


def workload(table: dict, name: str, sample: np.ndarray, step: float, args: Any) -> dict:
    prov = provision(Planner(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores))
    planner = Planner(table, sample, slo_ms=args.slo_ms, max_cores=args.max_cores)
    cfg = prov.best.config
    max_batch = max(b for (t, b) in table if t <= cfg.cpus)
    opt = Optimizer(table, cpus=cfg.cpus, max_batch=max_batch)
    windows = window_sizes(opt.plan(cfg.batch).expected_latency_ms / 1000.0, min_window_s=0.1)
    growth = growth_within(sample, args.startup_s + 1.0, noise_z=1.0)

    def make_tuner() -> Tuner:
        return Tuner(
            planned_replicas=cfg.replicas,
            replica_capacity=backlogged_capacity(table, opt.plan(cfg.batch).expand()),
            windows=windows,
            planned_rates=envelope(sample, [min(w, float(sample[-1])) for w in windows]).tolist(),
            max_replicas=planner.max_cores // cfg.cpus,
            scale_down_delay_s=60.0,
            noise_z=3.0,
            startup_s=args.startup_s,
            growth=growth,
        )

    ctx = {
        "opt": opt, "tuner": make_tuner, "startup_s": args.startup_s, "switch_s": args.switch_s,
        "max_batch": max_batch, "batch": cfg.batch, "replicas": cfg.replicas, "cpus": cfg.cpus,
        "slo_ms": args.slo_ms, "near_hold": args.near_hold,
    }  # fmt: skip
    rows: dict[str, list[dict]] = {v: [] for v in args.variants}
    for seed in args.seeds:  # the variants interleaved on each trace
        trace = step_trace([args.rate, step * args.rate], cv=1.0, phase_s=120, seed=seed)
        pick = np.random.default_rng([seed, 7]).random(trace.size)
        chain = Chain(trace=trace, pick=pick, table=table, switch=args.switch_model)
        for variant, runs in rows.items():
            runs.append(run_variant(variant, chain, ctx))
    return {"workload": name, "plan": cfg.label, "rows": rows}


def summary(runs: list[dict], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="base rate (x4 after the step)")
    parser.add_argument("--slo-ms", type=float, default=500.0)
    parser.add_argument("--startup-s", type=float, default=5.0)
    parser.add_argument("--switch-s", type=float, default=1.0)
    parser.add_argument("--max-cores", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[31, 32, 33])
    parser.add_argument(
        "--switch-model",
        choices=("share", "carry", "drain"),
        default="share",
        help="at a plan switch the unanswered queries finish on the old plan while the new "
        "one serves new arrivals, both at half speed until the old is idle (share: the "
        "dispatcher's swap), move to the new plan's queue (carry) or finish on the old plan "
        "as if it had the cores to itself (drain: optimistic)",
    )
    parser.add_argument(
        "--near-hold",
        type=float,
        default=FastPolicy().near_hold,
        help="the fast trigger's hold for a neighbouring batch, in sustain times",
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--stem", default="joint-step")
    args = parser.parse_args()
    table = dict(load_profile(PROFILE).table())
    r = args.rate
    steady = gamma_trace(r, cv=1.0, duration_s=60, seed=30)
    samples = [
        ("step, sample has it", step_trace([r, 4 * r], cv=1.0, phase_s=120, seed=41), 4.0),
        ("step, steady sample", steady, 4.0),
        ("no step, steady sample", steady, 1.0),
    ]
    out = [workload(table, name, sample, step, args) for name, sample, step in samples]
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_timelines(RESULTS / f"{args.stem}-timeline.csv", out)
    (RESULTS / f"{args.stem}.json").write_text(
        json.dumps({"args": vars(args), "results": out}, indent=1, default=float) + "\n"
    )
    text = report(out, args)
    (RESULTS / f"{args.stem}.txt").write_text(text)
    print(text)


def write_timelines(path: Path, out: list[dict]) -> None:
    """The first seed's per-second timeline of the operator's rules and ``fixed`` around the
    step (100-220 s; taken out of every row)."""
    with path.open("w", newline="") as f:
        out_csv = csv.writer(f, lineterminator="\n")
        out_csv.writerow(["workload", "variant", "second", *TIMELINE])
        for w in out:
            for variant, runs in w["rows"].items():
                for i, run in enumerate(runs):
                    rows = run.pop("timeline")
                    if i == 0 and variant in TIMELINE_VARIANTS:
                        out_csv.writerows(
                            [w["workload"], variant, *r] for r in rows if 100 <= r[0] <= 220
                        )


def report(out: list[dict], args: Any) -> str:
    lines = [
        f"base rate {args.rate:g}/s, then the step (4x or none) at 120 s, SLO {args.slo_ms:g} ms, "
        f"start-up {args.startup_s:g} s, switch {args.switch_s:g} s ({args.switch_model}), "
        f"{PROFILE.name}, seeds {args.seeds}: median (min-max)"
    ]
    for w in out:
        lines += ["", f"{w['workload']}: planned {w['plan']}"]
        for variant, runs in w["rows"].items():
            m, lo, hi = summary(runs, "misses")
            c, clo, chi = summary(runs, "cores")
            p, plo, phi = summary(runs, "p99_ms")
            s, slo, shi = summary(runs, "plan_switches")
            lines.append(
                f"  {variant:22} misses {100 * m:6.2f}% ({100 * lo:.2f}-{100 * hi:.2f})"
                f"  cores {c:5.1f} ({clo:.1f}-{chi:.1f})  P99 {p:8.1f} ms ({plo:.0f}-{phi:.0f})"
                f"  switches {s:g} ({slo:g}-{shi:g})"
            )
        for variant, runs in w["rows"].items():
            if variant != "fixed":
                lines.append(f"  {variant}, first seed: {runs[0]['plans']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
