"""Packrat's exact optimizer: the best mix of thin instances for T cores and batch B.

Problem: choose a multiset of profiled pairs (t_j, b_j), repetition allowed, with
sum t_j <= T and sum b_j = B, minimising max_j L(t_j, b_j); among equal latencies prefer
fewer instances, then fewer threads. It is a two-dimensional unbounded knapsack with a
max objective.

Why this algorithm: a min-max knapsack keeps optimal substructure for the latency, but the
tie-breaks (fewest instances, then threads) do not survive a max (a sub-plan that is faster
but uses more instances can lose once a slower instance joins it). So instead of one DP over
a lexicographic cost, the items are added in increasing order of latency to an *incremental*
unbounded knapsack whose cost is additive: ``count * (T + 1) + threads`` with the constraint
``threads <= c`` carried by the row index c. Additive lexicographic costs do have optimal
substructure. The first latency level at which batch B becomes feasible with T cores is the
optimal max latency; the table at that moment holds the fewest-instances-then-threads plan,
which is reconstructed right then. Adding one item to an unbounded knapsack is one pass over
c, vectorised over every B, so a single pass answers every B up to the maximum: on the
paper's profiles, T=16 and all B <= 1024 take milliseconds (see ``benchmarks/``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packrat.plan.profile import EAGER, Profile

Table = Mapping[tuple[int, int], float]


class PlanError(ValueError):
    """No valid plan exists for the request, or the request itself is invalid."""


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """``count`` identical instances, each with ``threads`` threads serving batch ``batch``."""

    threads: int
    batch: int
    count: int
    latency_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"threads": self.threads, "batch": self.batch, "count": self.count}
        if self.latency_ms is not None:
            out["latency_ms"] = self.latency_ms
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceGroup:
        if not isinstance(data, Mapping):
            raise PlanError(f"an instance must be an object, got {type(data).__name__}")
        latency = data.get("latency_ms")
        return cls(
            threads=_positive_int(data.get("threads"), "threads"),
            batch=_positive_int(data.get("batch"), "batch"),
            count=_positive_int(data.get("count", 1), "count"),
            latency_ms=None if latency is None else _latency(latency, "instance latency_ms"),
        )


# No replica has more cores than this; a plan file asking for more is malformed, not big.
MAX_PLAN_CPUS = 4096
# as the CRD's batchSize: a plan read from outside (a pod's /admin/plan, a ConfigMap) with a
# larger batch would have the pod's warm-up send that many requests to each instance
MAX_PLAN_BATCH = 1024


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= (1 << 20):
        shown = repr(value) if not isinstance(value, int) or value < 1 else "a huge integer"
        raise PlanError(f"instance {name} must be an integer >= 1, got {shown[:60]}")
    return value


def _latency(value: Any, name: str) -> float:
    """A finite, positive latency in ms (strings, NaN, infinities and booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{name} must be a number, got {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:
        raise PlanError(f"{name} is out of range") from None
    if not math.isfinite(out) or out <= 0:
        raise PlanError(f"{name} must be a finite number > 0, got {out}")
    return out


@dataclass(frozen=True, slots=True)
class Alternative:
    """A configuration the optimizer compared against (fat, one instance per core)."""

    name: str
    instances: tuple[InstanceGroup, ...]
    latency_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": [g.to_dict() for g in self.instances],
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The optimizer's answer for ``cpus`` cores and batch ``batch``."""

    cpus: int
    batch: int
    instances: tuple[InstanceGroup, ...]
    expected_latency_ms: float
    fat_latency_ms: float | None
    alternatives: tuple[Alternative, ...] = field(default=())
    model: str | None = None
    engine: str = EAGER  # what every instance runs (packrat.runtime.engines)

    @property
    def expected_speedup(self) -> float | None:
        if self.fat_latency_ms is None:
            return None
        return self.fat_latency_ms / self.expected_latency_ms

    @property
    def num_instances(self) -> int:
        return sum(g.count for g in self.instances)

    @property
    def total_threads(self) -> int:
        return sum(g.threads * g.count for g in self.instances)

    @property
    def capacity(self) -> int:
        """The batch the instances hold together: ``batch``, or more for a padded plan (a
        batch served by a larger batch's faster plan, slots left idle; see plan/padding.py)."""
        return sum(g.batch * g.count for g in self.instances)

    @property
    def label(self) -> str:
        """Short form for printer columns: ``4x4t/b8`` or ``2x4t/b4+1x8t/b8``, followed by the
        engine unless it is eager (``2x1t/b8 openvino``)."""
        shape = "+".join(f"{g.count}x{g.threads}t/b{g.batch}" for g in self.instances)
        return shape if self.engine == EAGER else f"{shape} {self.engine}"

    def expand(self) -> list[tuple[int, int]]:
        """One ``(threads, batch)`` per instance, widest instances first."""
        return [(g.threads, g.batch) for g in self.instances for _ in range(g.count)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "batch": self.batch,
            "instances": [g.to_dict() for g in self.instances],
            "expected_latency_ms": self.expected_latency_ms,
            "fat_latency_ms": self.fat_latency_ms,
            "expected_speedup": self.expected_speedup,
            "num_instances": self.num_instances,
            "total_threads": self.total_threads,
            "label": self.label,
            "capacity": self.capacity,
            "alternatives": {a.name: a.to_dict() for a in self.alternatives},
            **({"model": self.model} if self.model else {}),
            # eager plans keep their old form (and the serving hashes computed from it)
            **({"engine": self.engine} if self.engine != EAGER else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Parse the JSON that ``packrat plan --format json`` prints (extra keys ignored)."""
        if not isinstance(data, Mapping):
            raise PlanError("a plan must be a JSON object")
        try:
            raw = data["instances"]
            if not isinstance(raw, list):
                raise PlanError("plan instances must be a list")
            instances = tuple(InstanceGroup.from_dict(g) for g in raw)
            cpus = _positive_int(data["cpus"], "cpus")
            batch = _positive_int(data["batch"], "batch")
            latency = _latency(data["expected_latency_ms"], "expected_latency_ms")
        except KeyError as exc:
            raise PlanError(f"plan is missing {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"plan is malformed: {exc}") from None
        if cpus > MAX_PLAN_CPUS:
            raise PlanError(f"plan cpus must be at most {MAX_PLAN_CPUS}")
        if batch > MAX_PLAN_BATCH:
            raise PlanError(f"plan batch must be at most {MAX_PLAN_BATCH}, got {batch}")
        if not instances:
            raise PlanError("plan has no instances")
        threads = sum(g.threads * g.count for g in instances)
        if threads > cpus:
            raise PlanError(f"plan uses {threads} threads but only {cpus} cpus")
        total = sum(g.batch * g.count for g in instances)
        if total < batch:  # more is a padded plan: slots left idle
            raise PlanError(f"plan instances serve batch {total}, expected {batch}")
        if total > MAX_PLAN_BATCH:
            raise PlanError(f"plan instances hold {total}, at most {MAX_PLAN_BATCH}")
        fat = data.get("fat_latency_ms")
        raw_alts = data.get("alternatives") or {}
        if not isinstance(raw_alts, Mapping) or not all(
            isinstance(a, Mapping) and isinstance(a.get("instances", []), list)
            for a in raw_alts.values()
        ):
            raise PlanError("plan alternatives must map names to objects with an instance list")
        alternatives = tuple(
            Alternative(
                name=str(name),
                instances=tuple(InstanceGroup.from_dict(g) for g in alt.get("instances", [])),
                latency_ms=None
                if alt.get("latency_ms") is None
                else _latency(alt["latency_ms"], f"{name} latency_ms"),
            )
            for name, alt in raw_alts.items()
        )
        model = data.get("model")
        if model is not None and not isinstance(model, str):
            raise PlanError("plan model must be a string")
        engine = data.get("engine", EAGER)
        if not isinstance(engine, str) or not engine or len(engine) > 32 or not engine.isascii():
            raise PlanError(f"plan engine must be a short name, got {str(engine)[:40]!r}")
        return cls(
            cpus=cpus,
            batch=batch,
            instances=instances,
            expected_latency_ms=latency,
            fat_latency_ms=None if fat is None else _latency(fat, "fat_latency_ms"),
            alternatives=alternatives,
            model=model,
            engine=engine,
        )


def group_instances(pairs: Sequence[tuple[int, int]], table: Table) -> tuple[InstanceGroup, ...]:
    """Collapse ``(threads, batch)`` pairs into groups, widest and largest first."""
    counts: dict[tuple[int, int], int] = {}
    for pair in pairs:
        counts[pair] = counts.get(pair, 0) + 1
    return tuple(
        InstanceGroup(threads=t, batch=b, count=n, latency_ms=table.get((t, b)))
        for (t, b), n in sorted(counts.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
    )


class Optimizer:
    """Solves every batch size 1..``max_batch`` for ``cpus`` cores in one pass.

    Construct once per (profile, T) and ask ``plan(B)`` as often as needed: answers are
    precomputed, so online reconfiguration never recomputes the DP.
    """

    def __init__(
        self,
        table: Table,
        *,
        cpus: int,
        max_batch: int,
        model: str | None = None,
        alternatives: bool = True,
        engine: str = EAGER,
    ) -> None:
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus <= 0:
            raise PlanError(f"cpus must be a positive integer, got {cpus!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch <= 0:
            raise PlanError(f"batch must be a positive integer, got {max_batch!r}")
        for (t, b), latency in table.items():
            if t < 1 or b < 1 or not (math.isfinite(latency) and latency > 0):
                raise PlanError(f"invalid profile point threads={t} batch={b} latency={latency}")
        self.table: dict[tuple[int, int], float] = dict(table)
        self.cpus = cpus
        self.max_batch = max_batch
        self.model = model
        self.engine = engine
        self._with_alternatives = alternatives
        self._latency: dict[int, float] = {}
        self._pairs: dict[int, list[tuple[int, int]]] = {}
        self._solve()
        self._per_core: Optimizer | None = None
        if alternatives:
            per_core = {k: v for k, v in self.table.items() if k[0] == 1}
            if per_core:
                self._per_core = Optimizer(
                    per_core, cpus=cpus, max_batch=max_batch, alternatives=False
                )

    @classmethod
    def for_profile(cls, profile: Profile, *, cpus: int, max_batch: int) -> Optimizer:
        """The optimizer of a profile; of several engines: the best plan per engine, then the
        best over engines (:class:`packrat.plan.engines.EngineOptimizer`)."""
        engines = profile.engines
        if len(engines) > 1:
            from packrat.plan.engines import EngineOptimizer

            return EngineOptimizer(
                profile.tables(), cpus=cpus, max_batch=max_batch, model=profile.meta.model
            )
        return cls(
            profile.table(),
            cpus=cpus,
            max_batch=max_batch,
            model=profile.meta.model,
            engine=engines[0],
        )

    # -- the DP ------------------------------------------------------------------------------
    def _solve(self) -> None:
        cpus, max_b = self.cpus, self.max_batch
        items = sorted(
            ((lat, t, b) for (t, b), lat in self.table.items() if t <= cpus and b <= max_b),
        )
        weight = cpus + 1  # one instance outweighs any number of threads (threads <= cpus)
        inf = np.iinfo(np.int64).max // 4
        cost = np.full((cpus + 1, max_b + 1), inf, dtype=np.int64)
        cost[:, 0] = 0
        answered = np.zeros(max_b + 1, dtype=bool)
        answered[0] = True
        allowed_t: list[int] = []
        allowed_b: list[int] = []
        i = 0
        while i < len(items):
            level = items[i][0]
            while i < len(items) and items[i][0] == level:
                _, t, b = items[i]
                step = weight + t
                for c in range(t, cpus + 1):  # ascending c: unbounded copies of this item
                    np.minimum(cost[c, b:], cost[c - t, : max_b + 1 - b] + step, out=cost[c, b:])
                allowed_t.append(t)
                allowed_b.append(b)
                i += 1
            newly = np.flatnonzero((cost[cpus] < inf) & ~answered)
            if newly.size:
                answered[newly] = True
                ts = np.array(allowed_t, dtype=np.int64)
                bs = np.array(allowed_b, dtype=np.int64)
                for batch in newly.tolist():
                    self._latency[batch] = level
                    self._pairs[batch] = self._reconstruct(cost, batch, ts, bs, weight)
            if answered.all():
                break

    def _reconstruct(
        self, cost: np.ndarray, batch: int, ts: np.ndarray, bs: np.ndarray, weight: int
    ) -> list[tuple[int, int]]:
        pairs: list[tuple[int, int]] = []
        c, rest = self.cpus, batch
        while rest > 0:
            ok = (ts <= c) & (bs <= rest)
            idx = np.flatnonzero(ok)
            prev = cost[c - ts[idx], rest - bs[idx]] + weight + ts[idx]
            hit = idx[np.flatnonzero(prev == cost[c, rest])[0]]
            t, b = int(ts[hit]), int(bs[hit])
            pairs.append((t, b))
            c -= t
            rest -= b
        return pairs

    # -- answers -----------------------------------------------------------------------------
    def feasible(self, batch: int) -> bool:
        return batch in self._latency

    def latency(self, batch: int) -> float:
        """The optimal expected latency for ``batch``; PlanError when infeasible."""
        self._check(batch)
        return self._latency[batch]

    def _check(self, batch: int) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
            raise PlanError(f"batch must be a positive integer, got {batch!r}")
        if batch > self.max_batch:
            raise PlanError(f"batch {batch} exceeds this optimizer's maximum {self.max_batch}")
        if batch not in self._latency:
            usable = sorted({b for (t, b) in self.table if t <= self.cpus})
            threads = sorted({t for (t, _) in self.table})
            raise PlanError(
                f"no combination of profiled (threads, batch) pairs fits {self.cpus} cpus with "
                f"a total batch of {batch} (profiled threads {threads}, batches {usable})"
            )

    def plan(self, batch: int) -> Plan:
        self._check(batch)
        groups = group_instances(self._pairs[batch], self.table)
        fat = self.table.get((self.cpus, batch))
        alternatives: list[Alternative] = []
        if self._with_alternatives:
            alternatives.append(
                Alternative(
                    name="fat",
                    instances=(InstanceGroup(self.cpus, batch, 1, fat),),
                    latency_ms=fat,
                )
            )
            per_core = self._per_core
            if per_core is not None and per_core.feasible(batch):
                pc = per_core.plan(batch)
                alternatives.append(
                    Alternative(
                        "per_core", instances=pc.instances, latency_ms=pc.expected_latency_ms
                    )
                )
            else:
                alternatives.append(Alternative("per_core", instances=(), latency_ms=None))
        return Plan(
            cpus=self.cpus,
            batch=batch,
            instances=groups,
            expected_latency_ms=self._latency[batch],
            fat_latency_ms=fat,
            alternatives=tuple(alternatives),
            model=self.model,
            engine=self.engine,
        )


def optimize(table: Table | Profile, *, cpus: int, batch: int) -> Plan:
    """One plan for ``cpus`` cores and batch ``batch`` (see :class:`Optimizer`)."""
    if isinstance(table, Profile):
        return Optimizer.for_profile(table, cpus=cpus, max_batch=batch).plan(batch)
    return Optimizer(table, cpus=cpus, max_batch=batch).plan(batch)
