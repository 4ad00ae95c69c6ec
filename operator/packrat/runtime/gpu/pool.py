"""Many models on one GPU under a device-memory budget: LCache prefixes or whole-model LRU.

Every model's weights stay pinned in host memory; the device holds, per model, the tensors of
a resident prefix of its stages. The budget bounds the resident bytes at all times; a cold pass
also holds, while it runs, the buffers of the stages it loads (at most one model's size: the
pool serves one request at a time), which are dropped afterwards.

- ``policy="lcache"``: the prefixes come from :func:`packrat.plan.pool.lcache.plan_curves` over each
  model's GPU curve (:func:`packrat.plan.gpu.layerplan.lcache_curve`, from its measured per-stage
  profile) and its request rate; :meth:`DevicePool.replan` applies a plan by evicting from the
  tail first, then loading front first. A request runs its resident prefix and the rest by the
  per-layer plan (loaded in the pipeline, or read in place with ``cold="dha"``).
- ``policy="lru"`` (KServe ModelMesh's): a request for a model not on the device loads it whole
  (``cold="load-then-run"``: copy, then run; ``"pipelined"``: copy while running), evicting the
  least recently used models until it fits (:func:`packrat.plan.pool.lcache.lru_access`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from packrat.plan.gpu.layerplan import (
    LayerPlan,
    Placement,
    StageProfile,
    best_placement,
    in_place_always,
    lcache_curve,
)
from packrat.plan.pool.lcache import Residency, evictions, loads, lru_access, plan_curves
from packrat.runtime.gpu.device import Device
from packrat.runtime.gpu.executor import HostWeights, ModelMemory, run_pass
from packrat.runtime.gpu.stages import StagedModel

__all__ = ["Cold", "DevicePool", "Policy"]

Policy = Literal["lcache", "lru"]
Cold = Literal["load-then-run", "pipelined", "dha"]


@dataclass
class _Entry:
    mem: ModelMemory
    profile: tuple[StageProfile, ...]
    rate: float
    fixed_host: frozenset[int] = frozenset()  # read in place even when warm (embeddings)
    plans: dict[int, LayerPlan] = field(default_factory=dict)
    count: int = 0  # requests since the rates were last updated from traffic


@dataclass
class PoolStats:
    requests: int = 0
    cold: int = 0  # requests that found their model not wholly resident
    bytes_copied: int = 0


class DevicePool:
    def __init__(
        self, device: Device, budget_bytes: int, *, policy: Policy = "lcache", cold: Cold = "dha"
    ) -> None:
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0 bytes")
        self.device = device
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.cold = cold
        self.models: dict[str, _Entry] = {}
        self.stats = PoolStats()
        self._lru: tuple[str, ...] = ()
        self._sizes: dict[str, int] = {}

    def add(
        self,
        name: str,
        staged: StagedModel,
        profile: list[StageProfile],
        rate: float = 0.0,
        *,
        host: HostWeights | None = None,
    ) -> None:
        """Pin the model's weights in host memory, packed per stage (or use ``host``, packed
        already, e.g. shared by pools compared side by side); nothing goes to the device yet."""
        if name in self.models:
            raise ValueError(f"model {name} is already in the pool")
        if len(profile) != len(staged.stages):
            raise ValueError(
                f"{name}: {len(profile)} stage profiles for {len(staged.stages)} stages"
            )
        mem = (
            ModelMemory(staged, self.device, host)
            if host is not None
            else ModelMemory.pinned(staged, self.device)
        )
        fixed = in_place_always(profile) if self.cold == "dha" else frozenset()
        self.models[name] = _Entry(mem, tuple(profile), rate, fixed)
        self._sizes[name] = mem.packed.total_bytes

    def set_rate(self, name: str, rate: float) -> None:
        self.models[name].rate = rate

    def resident_bytes(self) -> int:
        return sum(e.mem.resident_bytes() for e in self.models.values())

    def prefixes(self) -> dict[str, int]:
        return {n: self._prefix(e) for n, e in self.models.items()}

    @staticmethod
    def _prefix(e: _Entry) -> int:
        """The resident prefix, the in-place stages at its end not counted (as plans count)."""
        p = e.mem.resident_prefix(e.fixed_host)
        while p > 0 and p - 1 in e.fixed_host:
            p -= 1
        return p

    # -- LCache -----------------------------------------------------------------------------
    def rates_from_traffic(self, window_s: float, *, keep: float = 0.5) -> dict[str, float]:
        """Update each model's rate from the requests counted over the last ``window_s``
        seconds (an exponential average: ``keep`` of the old rate stays), reset the counts."""
        if not window_s > 0 or not 0.0 <= keep < 1.0:
            raise ValueError("window must be > 0 s and keep in [0, 1)")
        for e in self.models.values():
            e.rate = keep * e.rate + (1.0 - keep) * e.count / window_s
            e.count = 0
        return {n: e.rate for n, e in self.models.items()}

    def replan(self) -> Residency:
        """Compute LCache's prefixes from the rates and apply them (evict tail-first, then load)."""
        if self.policy != "lcache":
            raise ValueError("replan is LCache's; LRU admits on demand")
        curves = [
            lcache_curve(
                n, e.rate, e.profile, allow_host=self.cold == "dha", fixed_host=e.fixed_host
            )
            for n, e in self.models.items()
        ]
        plan = plan_curves(curves, self.budget_bytes)
        current = self.prefixes()
        for name, stage in evictions(current, plan.prefix):
            self._drop(name, stage)
        for name, stage in loads(current, plan.prefix):
            self._load(name, stage)
        self.device.synchronize()
        return plan

    def _drop(self, name: str, stage: int) -> None:
        mem = self.models[name].mem
        mem.drop(mem.staged.stages[stage].owned)

    def _load(self, name: str, stage: int) -> None:
        e = self.models[name]
        if stage in e.fixed_host:
            return  # read in place even when warm: never on the device
        mem = e.mem
        if any(k not in mem.resident for k in mem.staged.stages[stage].owned):
            mem.put(mem.stage_on_device(stage))

    def _placements(self, name: str) -> tuple[tuple[Placement, ...], bool]:
        """This request's placement and whether it copies everything before running."""
        e = self.models[name]
        prefix = e.mem.resident_prefix(e.fixed_host)
        n = len(e.profile)
        if self.cold == "load-then-run" or (self.cold == "pipelined" and self.policy == "lru"):
            res: tuple[Placement, ...] = ("resident",)
            load: tuple[Placement, ...] = ("load",)
            plain = res * prefix + load * (n - prefix)
            return plain, self.cold == "load-then-run"
        if prefix not in e.plans:
            e.plans[prefix] = best_placement(
                e.profile, prefix, allow_host=self.cold == "dha", fixed_host=e.fixed_host
            )
        return e.plans[prefix].placements, False

    # -- serving ----------------------------------------------------------------------------
    def infer(self, name: str, x: Tensor) -> Tensor:
        """One request: run ``name`` on ``x`` (already on the device) under the pool's policy."""
        if name not in self.models:
            raise KeyError(f"no model {name} in the pool")
        e = self.models[name]
        self.stats.requests += 1
        e.count += 1
        if self.policy == "lru":
            step = lru_access(self._lru, self._sizes, self.budget_bytes, name)
            for victim in step.evicted:
                self.models[victim].mem.drop()
            self._lru = step.resident
        placements, load_first = self._placements(name)
        if e.mem.resident_prefix(e.fixed_host) < len(e.profile):
            self.stats.cold += 1
        out, loaded = run_pass(e.mem, placements, x, load_first=load_first)
        self.stats.bytes_copied += sum(t.numel() * t.element_size() for t in loaded.values())
        if self.policy == "lru" and name in self._lru:  # admitted: the whole model stays
            e.mem.put(loaded)
            for stage in range(len(e.profile)):
                self._load(name, stage)  # stages read in place this time, if any
        return out
