"""Placing many models on the pods of a pool: bin packing by memory and demand.

A pool pod (Ignite's regime) keeps a weight budget in RAM and serves more models than the
budget holds: the rest are read from the node's disk when asked for (layer-wise residency,
:mod:`packrat.plan.pool.lcache`). So memory is not a hard bin size here, it is pressure: a pod
whose models' weights add up to three budgets pays more cold starts than one with two. What
*is* hard:

- a model's weights must fit one pod's budget on their own (a request runs the whole model,
  and every layer it reads must be resident while it runs), and
- a pod's compute demand (each model's request rate times its service time, in cores) must
  stay within ``max_utilisation`` of the pod's cores.

Among the assignments that place the most models, the planner minimises the busiest pod's
normalised load ``max(cores used / cores, weight bytes / budget)`` (one number for both
kinds of pressure), then the number of models moved away from their previous pod (a move
is a cold start on the new pod). A model that cannot be placed gets a sentence saying why,
for its status condition.

Exact (depth-first branch and bound) up to ``EXACT_LIMIT`` models, a greedy
largest-demand-first, least-loaded-pod heuristic above it; both are checked against an
independent brute force in ``tests/unit/plan/test_pool_placement.py``.

Pure: no torch, no Kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "EXACT_LIMIT",
    "ModelDemand",
    "Placement",
    "PlacementError",
    "PodCapacity",
    "load_of",
    "place",
]

EXACT_LIMIT = 7
"""Up to this many models the search is exact; the greedy heuristic above it."""

GIB = 1024**3


class PlacementError(ValueError):
    """Malformed input: a negative size, a duplicate name."""


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What one model asks of a pod: its weight bytes and its compute demand."""

    name: str
    weight_bytes: int
    rate: float = 0.0
    """Requests per second expected."""
    service_s: float = 0.0
    """Seconds of one core per request on the pool's pod shape (from the profile)."""

    @property
    def cores(self) -> float:
        return self.rate * self.service_s


@dataclass(frozen=True, slots=True)
class PodCapacity:
    """One pool pod: its weight budget and its cores."""

    name: str
    budget_bytes: int
    cores: float


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each model goes, and why the others do not."""

    assignment: Mapping[str, str]
    """model name -> pod name."""
    unplaced: Mapping[str, str] = field(default_factory=dict)
    """model name -> the reason, one sentence."""
    load: float = 0.0
    """The busiest pod's normalised load (see :func:`load_of`)."""
    moves: int = 0
    """Models placed on another pod than ``previous`` had them on."""


def _check(models: Sequence[ModelDemand], pods: Sequence[PodCapacity]) -> None:
    for kind, names in (("model", [m.name for m in models]), ("pod", [p.name for p in pods])):
        if len(set(names)) != len(names):
            raise PlacementError(f"duplicate {kind} names: {sorted(names)}")
    for m in models:
        if m.weight_bytes < 0 or not (m.rate >= 0 and m.service_s >= 0):
            raise PlacementError(f"model {m.name}: sizes and rates must be >= 0")
        if not (math.isfinite(m.rate) and math.isfinite(m.service_s)):
            raise PlacementError(f"model {m.name}: rate and service time must be finite")
    for p in pods:
        if p.budget_bytes <= 0 or not (p.cores > 0 and math.isfinite(p.cores)):
            raise PlacementError(f"pod {p.name}: budget and cores must be > 0")


def load_of(
    assignment: Mapping[str, str],
    models: Sequence[ModelDemand],
    pods: Sequence[PodCapacity],
) -> float:
    """The busiest pod's ``max(cores used / cores, weight bytes / budget)``; 0 when empty."""
    by_name = {m.name: m for m in models}
    worst = 0.0
    for pod in pods:
        mine = [by_name[n] for n, p in assignment.items() if p == pod.name]
        cores = sum(m.cores for m in mine) / pod.cores
        memory = sum(m.weight_bytes for m in mine) / pod.budget_bytes
        worst = max(worst, cores, memory)
    return worst


def _key(placed: int, load: float, moves: int) -> tuple[int, float, int]:
    return (-placed, round(load, 9), moves)


@dataclass(slots=True)
class _Search:
    """One placement problem (the models largest demand first, the pods, each model's previous
    pod, the usable fraction ``cap`` of a pod's cores) and what is placed on each pod so far;
    :meth:`exact` and :meth:`greedy` solve it."""

    order: list[ModelDemand]
    pods: Sequence[PodCapacity]
    previous: Mapping[str, str]
    cap: float
    cores: list[float]
    memory: list[int]

    @classmethod
    def of(
        cls,
        models: Sequence[ModelDemand],
        pods: Sequence[PodCapacity],
        previous: Mapping[str, str],
        cap: float,
    ) -> _Search:
        order = sorted(models, key=lambda m: (-m.cores, -m.weight_bytes, m.name))
        return cls(order, pods, previous, cap, [0.0] * len(pods), [0] * len(pods))

    def fits(self, m: ModelDemand, i: int) -> bool:
        pod = self.pods[i]
        return (
            m.weight_bytes <= pod.budget_bytes
            and self.cores[i] + m.cores <= self.cap * pod.cores + 1e-9
        )

    def put(self, m: ModelDemand, i: int) -> None:
        self.cores[i] += m.cores
        self.memory[i] += m.weight_bytes

    def take(self, m: ModelDemand, i: int) -> None:
        self.cores[i] -= m.cores
        self.memory[i] -= m.weight_bytes

    def load(self, i: int, m: ModelDemand | None = None) -> float:
        """Pod ``i``'s normalised load, with ``m`` added when given."""
        cores, memory = self.cores[i], self.memory[i]
        if m is not None:
            cores, memory = cores + m.cores, memory + m.weight_bytes
        pod = self.pods[i]
        return max(cores / pod.cores, memory / pod.budget_bytes)

    def exact(self) -> dict[str, str]:
        """Depth-first over every model's pod (or none), pruned by the best key found so far."""
        order, pods = self.order, self.pods
        best: list[tuple[tuple[int, float, int], dict[str, str]]] = []
        current: dict[str, str] = {}

        def bound_load() -> float:
            return max([0.0] + [self.load(i) for i in range(len(pods))])

        def rec(k: int, moves: int) -> None:
            placed = len(current)
            optimistic = _key(placed + len(order) - k, bound_load(), moves)
            if best and optimistic >= best[0][0]:
                return
            if k == len(order):
                best[:] = [(_key(placed, bound_load(), moves), dict(current))]
                return
            m = order[k]
            for i, pod in enumerate(pods):
                if not self.fits(m, i):
                    continue
                self.put(m, i)
                current[m.name] = pod.name
                moved = int(m.name in self.previous and self.previous[m.name] != pod.name)
                rec(k + 1, moves + moved)
                del current[m.name]
                self.take(m, i)
            rec(k + 1, moves)  # leave it out

        rec(0, 0)
        return best[0][1] if best else {}

    def greedy(self) -> dict[str, str]:
        """Largest demand first, each onto the pod whose load stays lowest (its previous pod on
        a tie), so the busiest pod ends as light as this order allows."""
        out: dict[str, str] = {}
        for m in self.order:
            choices = [
                (round(self.load(i, m), 9), self.previous.get(m.name) != pod.name, i)
                for i, pod in enumerate(self.pods)
                if self.fits(m, i)
            ]
            if choices:
                _, _, i = min(choices)
                self.put(m, i)
                out[m.name] = self.pods[i].name
        return out


def _reason(m: ModelDemand, pods: Sequence[PodCapacity], cap: float) -> str:
    if not pods:
        return "the pool has no pods"
    biggest = max(p.budget_bytes for p in pods)
    if m.weight_bytes > biggest:
        return (
            f"its weights ({m.weight_bytes / GIB:.2f} GiB) exceed the largest pod's weight "
            f"budget ({biggest / GIB:.2f} GiB): a request needs the whole model resident"
        )
    most = max(cap * p.cores for p in pods)
    if m.cores > most:
        return (
            f"its demand ({m.rate:g} req/s x {m.service_s * 1000:.0f} ms = {m.cores:.2f} cores) "
            f"exceeds a pod's {most:.2f} usable cores"
        )
    return (
        f"no pod has {m.cores:.2f} cores of headroom left after the busier models "
        f"(at most {cap:.0%} of a pod's cores are planned)"
    )


def place(
    models: Sequence[ModelDemand],
    pods: Sequence[PodCapacity],
    *,
    previous: Mapping[str, str] | None = None,
    max_utilisation: float = 0.8,
) -> Placement:
    """Assign ``models`` to ``pods`` (see the module's docstring for the objective)."""
    _check(models, pods)
    if not 0 < max_utilisation <= 1:
        raise PlacementError("max_utilisation must be in (0, 1]")
    prev = dict(previous or {})  # a model whose pod is gone moves too (a cold start elsewhere)
    search = _Search.of(models, pods, prev, max_utilisation)
    exact = len(models) <= EXACT_LIMIT
    assignment = (search.exact() if exact else search.greedy()) if pods else {}
    unplaced = {
        m.name: _reason(m, pods, max_utilisation) for m in models if m.name not in assignment
    }
    moves = sum(1 for n, p in assignment.items() if n in prev and prev[n] != p)
    return Placement(
        assignment=dict(sorted(assignment.items())),
        unplaced=unplaced,
        load=load_of(assignment, models, pods),
        moves=moves,
    )
