"""The pool's residency manager: which layers of which models stay in RAM under the budget.

It decides; the caller (:mod:`packrat.serve.pool.app`) acts, dropping pages with
:meth:`~packrat.runtime.layerfile.LayerFile.evict` and measuring what is resident with
``mincore``. Two policies, both from :mod:`packrat.plan.pool.lcache`:

- ``lru``: whole models, least recently used evicted first (KServe ModelMesh); a request for
  a model not resident makes room for all of it before it runs.
- ``lcache``: resident *prefixes*. Before a request, the other models' tails are trimmed
  (cheapest loss per byte first, :func:`~packrat.plan.pool.lcache.trim_to_budget`) until the
  requested model fits whole beside them; after it, the plan
  (:func:`~packrat.plan.pool.lcache.plan_residency`: the prefixes minimising the rate-weighted
  cold latency within the budget) is recomputed from the request rates seen over the last
  ``window_s`` and every model idle beyond its planned prefix is trimmed to it. Prefixes grow
  only when a request runs a model (nothing is read speculatively).

A model that is running is pinned: neither policy evicts its layers under it. Thread-safe.
No torch here: layer sizes and compute times come in as numbers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from packrat.plan.pool import lcache

__all__ = ["POLICIES", "Policy", "ResidencyManager"]

Policy = Literal["lru", "lcache"]
POLICIES: tuple[Policy, ...] = ("lru", "lcache")


@dataclass(frozen=True, slots=True)
class _Model:
    layer_bytes: tuple[int, ...]
    compute_s: tuple[float, ...]
    latency_s: tuple[float, ...]  # cold latency with prefix p = 0..n (rate-independent)


class ResidencyManager:
    """Tracks each model's resident prefix (in layers) and decides evictions."""

    def __init__(
        self,
        models: Mapping[str, tuple[Sequence[int], Sequence[float]]],
        *,
        budget_bytes: int,
        rate_bps: float,
        policy: Policy,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        read_ahead_bytes: int | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.budget, self.policy, self.window_s, self._clock = budget_bytes, policy, window_s, clock
        self._models: dict[str, _Model] = {}
        # the reader's window (bytes; None: one layer ahead); one curve per distinct shape
        window = (
            {"lookahead": 1} if read_ahead_bytes is None else {"window_bytes": read_ahead_bytes}
        )
        known: dict[tuple[tuple[int, ...], tuple[float, ...]], _Model] = {}
        for name, (sizes, compute) in models.items():
            key = (tuple(sizes), tuple(compute))
            if key not in known:
                shape = lcache.ModelLayers(name, *key, 0.0)
                curve = lcache.latency_curve(shape, rate_bps, **window)
                known[key] = _Model(shape.layer_bytes, shape.compute_s, curve.latency_s)
            self._models[name] = known[key]
        self.prefix: dict[str, int] = dict.fromkeys(self._models, 0)
        self._lru: list[str] = []  # least recent first (both policies keep it, lru uses it)
        self._arrivals: dict[str, deque[float]] = {n: deque() for n in self._models}
        self._pinned: dict[str, int] = dict.fromkeys(self._models, 0)
        self._lock = threading.Lock()

    # -- accounting -----------------------------------------------------------------------
    def _bytes(self, name: str, p: int | None = None) -> int:
        sizes = self._models[name].layer_bytes
        return sum(sizes[: self.prefix[name] if p is None else p])

    def used(self) -> int:
        """Bytes the resident prefixes hold (the plan's view; the pool measures the real)."""
        with self._lock:
            return sum(self._bytes(n) for n in self._models)

    def rates(self) -> dict[str, float]:
        now = self._clock()
        out = {}
        for name, times in self._arrivals.items():
            while times and times[0] < now - self.window_s:
                times.popleft()
            out[name] = len(times) / self.window_s
        return out

    def _curves(self, rates: Mapping[str, float], names: Sequence[str]) -> list[lcache.Curve]:
        out = []
        for n in names:
            m = self._models[n]
            sizes = [0]
            for b in m.layer_bytes:
                sizes.append(sizes[-1] + b)
            out.append(lcache.Curve(n, rates.get(n, 0.0), m.latency_s, tuple(sizes)))
        return out

    # -- the two moments a request has ---------------------------------------------------
    def before(self, name: str) -> list[tuple[str, int]]:
        """``name`` is about to run (pinned until :meth:`after`): the ``(model, layer)`` pages
        to drop first so that it fits whole beside the others."""
        with self._lock:
            self._arrivals[name].append(self._clock())
            self._pinned[name] += 1
            need = self._bytes(name, len(self._models[name].layer_bytes))
            if self.policy == "lru":
                return self._make_room_lru(name, need)
            return self._make_room_lcache(name, need)

    def after(self, name: str) -> list[tuple[str, int]]:
        """``name`` ran (now wholly resident): the ``(model, layer)`` pages to drop now."""
        with self._lock:
            self._pinned[name] -= 1
            self.prefix[name] = len(self._models[name].layer_bytes)
            self._lru = [n for n in self._lru if n != name] + [name]
            if self.policy == "lru":
                over = sum(self._bytes(n) for n in self._models) > self.budget
                return self._drop(name, 0) if over and not self._pinned[name] else []
            return self._trim_to_plan()

    def _drop(self, name: str, keep: int) -> list[tuple[str, int]]:
        out = [(name, i) for i in range(self.prefix[name] - 1, keep - 1, -1)]
        self.prefix[name] = min(self.prefix[name], keep)
        if keep == 0:
            self._lru = [n for n in self._lru if n != name]
        return out

    def _make_room_lru(self, name: str, need: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        used = sum(self._bytes(n) for n in self._models if n != name)
        for victim in [n for n in self._lru if n != name]:
            if used + need <= self.budget:
                break
            if self._pinned[victim]:
                continue
            used -= self._bytes(victim)
            out += self._drop(victim, 0)
        return out

    def _make_room_lcache(self, name: str, need: int) -> list[tuple[str, int]]:
        others = [n for n in self._models if n != name and not self._pinned[n]]
        fixed = sum(self._bytes(n) for n in self._models if n != name and self._pinned[n])
        curves = self._curves(self.rates(), others)
        room = max(0, self.budget - need - fixed)
        trimmed = lcache.trim_to_budget(curves, {n: self.prefix[n] for n in others}, room)
        out: list[tuple[str, int]] = []
        for n in others:
            if trimmed.prefix[n] < self.prefix[n]:
                out += self._drop(n, trimmed.prefix[n])
        return out

    def _trim_to_plan(self) -> list[tuple[str, int]]:
        names = list(self._models)
        plan = lcache.plan_curves(self._curves(self.rates(), names), self.budget)
        out: list[tuple[str, int]] = []
        for n in names:
            if not self._pinned[n] and plan.prefix[n] < self.prefix[n]:
                out += self._drop(n, plan.prefix[n])
        # A plan that keeps a prefix not yet resident leaves room for it: trim the rest
        # further only if what is resident now is over budget.
        used = sum(self._bytes(n) for n in names)
        if used > self.budget:
            free = [n for n in names if not self._pinned[n]]
            fixed = sum(self._bytes(n) for n in names if self._pinned[n])
            trimmed = lcache.trim_to_budget(
                self._curves(self.rates(), free),
                {n: self.prefix[n] for n in free},
                max(0, self.budget - fixed),
            )
            for n in free:
                if trimmed.prefix[n] < self.prefix[n]:
                    out += self._drop(n, trimmed.prefix[n])
        return out
