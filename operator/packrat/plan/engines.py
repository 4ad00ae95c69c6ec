"""Plans over several engines: the best plan per engine, then the best over engines.

A profile of several engines holds one table per engine, L(engine, t, b) (each measured
co-located, floor(T/t) identical instances of that engine). The optimizer solves each
engine's table exactly (:class:`~packrat.plan.optimizer.Optimizer`, unchanged) and, per batch
B, keeps the engine whose plan is fastest; ties go to fewer instances, then fewer threads,
then the engine listed first (eager before the converted ones: nothing to load beyond the
model).

Why one engine per plan, not a mix: a mixed plan (each instance its own engine) is the same
DP over the per-pair fastest engine, so it is never slower on paper; but its instances would
run beside instances of another engine, which no profile point measured, and the pod would
hold two artefacts (two copies of the weights in memory, two start-ups). On the profiles
measured here one engine is fastest at nearly every (t, b), so the mix gains nothing; see
``mixed_gain`` and the engines section of docs/measurements.md.

"Fat" is the fastest single instance of any engine: the plan is compared with, and verified
against, the best one-instance configuration any installed engine offers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from packrat.plan.optimizer import (
    Alternative,
    InstanceGroup,
    Optimizer,
    Plan,
    PlanError,
    Table,
)
from packrat.plan.profile import EAGER


def _order(engine: str) -> tuple[bool, str]:
    return (engine != EAGER, engine)


def fastest_per_pair(tables: Mapping[str, Table]) -> dict[tuple[int, int], tuple[float, str]]:
    """Each (threads, batch)'s fastest engine and its latency (ties: eager, then by name)."""
    out: dict[tuple[int, int], tuple[float, str]] = {}
    for engine in sorted(tables, key=_order):
        for key, latency in tables[engine].items():
            if key not in out or latency < out[key][0]:
                out[key] = (latency, engine)
    return out


class EngineOptimizer(Optimizer):
    """Every batch 1..``max_batch`` for ``cpus`` cores over several engines' tables.

    The same interface as :class:`Optimizer` (``plan``, ``latency``, ``feasible``, ``table``:
    here each pair's fastest engine); the DP itself runs once per engine."""

    def __init__(
        self,
        tables: Mapping[str, Table],
        *,
        cpus: int,
        max_batch: int,
        model: str | None = None,
        alternatives: bool = True,
    ) -> None:
        if not tables:
            raise PlanError("no engine has a profile")
        self.by_engine = {
            engine: Optimizer(
                tables[engine],
                cpus=cpus,
                max_batch=max_batch,
                model=model,
                alternatives=alternatives,
                engine=engine,
            )
            for engine in sorted(tables, key=_order)
        }
        fastest = fastest_per_pair(tables)
        self.table = {key: latency for key, (latency, _) in fastest.items()}
        self._fastest = fastest
        self.cpus = cpus
        self.max_batch = max_batch
        self.model = model
        self.engine = "+".join(self.by_engine)
        self._with_alternatives = alternatives
        self._per_core = None
        self._latency = {}
        self._pairs = {}
        self.choice: dict[int, str] = {}
        for batch in range(1, max_batch + 1):
            best: tuple[float, int, int, tuple[bool, str]] | None = None
            for engine, opt in self.by_engine.items():
                if not opt.feasible(batch):
                    continue
                pairs = opt._pairs[batch]
                rank = (opt.latency(batch), len(pairs), sum(t for t, _ in pairs), _order(engine))
                if best is None or rank < best:
                    best = rank
                    self.choice[batch] = engine
            if best is not None:
                chosen = self.by_engine[self.choice[batch]]
                self._latency[batch] = chosen.latency(batch)
                self._pairs[batch] = chosen._pairs[batch]

    def fat(self, batch: int) -> tuple[float, str] | None:
        """The fastest single instance on all ``cpus`` cores: (latency, engine), or None."""
        return self._fastest.get((self.cpus, batch))

    def plan(self, batch: int) -> Plan:
        self._check(batch)
        plan = self.by_engine[self.choice[batch]].plan(batch)
        fat = self.fat(batch)
        alternatives = list(plan.alternatives)
        if self._with_alternatives:
            alternatives = [a for a in alternatives if a.name != "fat"]
            if fat is not None:
                group = InstanceGroup(self.cpus, batch, 1, fat[0])
                alternatives.insert(0, Alternative("fat", (group,), fat[0]))
                alternatives.append(Alternative(f"fat_engine_{fat[1]}", (group,), fat[0]))
            else:
                alternatives.insert(0, Alternative("fat", (), None))
            for engine, opt in self.by_engine.items():  # each engine's own best plan
                if opt.feasible(batch) and engine != plan.engine:
                    other = opt.plan(batch)
                    alternatives.append(
                        Alternative(f"best_{engine}", other.instances, other.expected_latency_ms)
                    )
        return replace(
            plan,
            fat_latency_ms=None if fat is None else fat[0],
            alternatives=tuple(alternatives),
        )


def mixed_gain(tables: Mapping[str, Table], *, cpus: int, max_batch: int) -> dict[int, float]:
    """Per batch, how much faster a plan mixing engines would be on paper than the best
    one-engine plan (1.0: no gain): the DP over each pair's fastest engine against
    :class:`EngineOptimizer`."""
    single = EngineOptimizer(tables, cpus=cpus, max_batch=max_batch, alternatives=False)
    mixed = Optimizer(single.table, cpus=cpus, max_batch=max_batch, alternatives=False)
    return {
        b: single.latency(b) / mixed.latency(b)
        for b in range(1, max_batch + 1)
        if single.feasible(b) and mixed.feasible(b)
    }
