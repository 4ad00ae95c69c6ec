"""LCache: which prefix of layers of each model stays in the fast tier (tier-agnostic).

Ignite's setting: a fast tier that is scarce (GPU memory; on CPU nodes, the pod's RAM holding
mapped weights in the page cache) and a slow tier every weight lives in (pinned host memory;
the node's disk). A model runs **pipelined**: layer ``i`` runs once it is in the fast tier and
layer ``i-1`` is done, and the missing layers are brought in forward order on one stream while
the earlier ones run. So a model whose first ``p`` layers are resident starts at once and its
cold latency is close to warm once ``p`` covers the layers whose compute hides the rest's
transfer. LCache keeps *prefixes* resident (a suffix would be useless: the pipeline starts at
layer 0) and evicts from the tail.

The pieces, all pure (no torch, numbers in, numbers out; seconds and bytes):

- :func:`pipeline_latency` -- the recurrence both tiers share. ``copy_s[i]`` is the time to
  bring layer ``i`` (0 when resident or read in place), ``compute_s[i]`` its execution time::

      load_end[i] = load_start[i] + copy_s[i]
      load_start[i] = max(load_end[i-1], run_end[i-1-lookahead])   (lookahead None: no bound)
      run_end[i]  = max(run_end[i-1], load_end[i]) + compute_s[i]

  and the latency is ``run_end[n-1]``. With unbounded lookahead it equals the critical path
  ``max(sum(compute), max_j (sum(copy[:j+1]) + sum(compute[j:])))``. With a window in bytes
  instead (``window_bytes``, the pool's reader): layer ``i`` may start loading once the bytes
  loaded and not yet started, with its own, fit the window (or none are ahead); layer ``r``
  starts at ``run_end[r-1]``, so ``load_start[i] = max(load_end[i-1], run_end[r-1])`` for the
  least running layer ``r`` at which what lies ahead, ``(r, i)``, fits (a bisection over the
  prefix sums of the loaded bytes).
- :func:`cold_latency` / :func:`latency_curve` -- a model's latency with its first ``p`` layers
  resident and the rest brought at ``rate_bps``; the curve over ``p = 0..n`` is non-increasing
  and ends at the warm latency ``sum(compute)``.
- :func:`sweet_spot` -- the smallest ``p`` whose cold latency is within ``tolerance`` (1.1, as
  in Ignite) of warm.
- :func:`plan_residency` -- the policy: the prefixes ``p_m`` minimising the rate-weighted
  expected latency ``sum_m rate_m * curve_m[p_m]`` subject to ``sum_m prefix_bytes_m[p_m] <=
  budget``: a multiple-choice knapsack (one prefix per model), solved exactly by dynamic
  programming on a byte grid. **Granularity**: each prefix's bytes are rounded *up* to whole
  grid units of ``granularity`` bytes (default ``max(1, budget // 4096)``) and the budget down,
  so the plan never exceeds the budget; it is exact (the brute-force optimum) when every
  layer's size is a multiple of the grid, and otherwise at least as good as the exact optimum
  for ``budget - n_models * granularity`` bytes (about ``n_models / 4096`` of the budget lost
  at the default). Work: ``O(sum_m (n_m + 1) * budget / granularity)``, vectorised.
  Callers with their own cold-latency model (the GPU tier's per-layer plan, where the
  non-resident layers are loaded or read in place) pass :class:`Curve` objects to
  :func:`plan_curves` directly.
- :func:`trim_to_budget` -- the online eviction: while over budget, drop the tail layer whose
  loss ``rate * (curve[p-1] - curve[p])`` per byte is smallest (never growing a prefix).
- :func:`evictions` / :func:`loads` -- the layer moves from a current residency to a target:
  evictions tail first, loads front first.
- :func:`lru_access` -- the baseline (KServe ModelMesh's policy): whole models, least recently
  used evicted first; a miss loads the whole model (a model larger than the budget is run but
  not admitted).

Interface for a tier: build :class:`ModelLayers` per model (per-layer bytes and compute time,
request rate), measure the slow tier's rate, call ``plan_residency(models, rate_bps,
budget_bytes)`` and apply ``evictions``/``loads`` from the residency you hold to
``plan.prefix``; between plans, ``trim_to_budget`` when a model's arrival overflows it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Curve",
    "LruStep",
    "ModelLayers",
    "Residency",
    "cold_latency",
    "evictions",
    "latency_curve",
    "loads",
    "lru_access",
    "pipeline_latency",
    "plan_curves",
    "plan_residency",
    "sweet_spot",
    "trim_to_budget",
]

SWEET_SPOT_TOLERANCE = 1.1  # Ignite: cold latency within 1.1x of warm
GRID_UNITS = 4096  # default byte grid: budget / 4096


@dataclass(frozen=True)
class ModelLayers:
    """One model as the policy sees it: per-layer bytes and compute seconds, requests/s."""

    name: str
    layer_bytes: tuple[int, ...]
    compute_s: tuple[float, ...]
    rate: float

    def __post_init__(self) -> None:
        if len(self.layer_bytes) != len(self.compute_s):
            raise ValueError(
                f"{self.name}: {len(self.layer_bytes)} sizes for {len(self.compute_s)} layers"
            )
        if any(b < 0 for b in self.layer_bytes) or any(not c >= 0 for c in self.compute_s):
            raise ValueError(f"{self.name}: layer sizes and compute times must be >= 0")
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise ValueError(f"{self.name}: rate must be finite and >= 0, got {self.rate!r}")

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes)

    def prefix_bytes(self) -> list[int]:
        """Bytes resident with ``p = 0..n`` layers."""
        out = [0]
        for b in self.layer_bytes:
            out.append(out[-1] + b)
        return out


@dataclass(frozen=True)
class Curve:
    """A model's cold latency ``latency_s[p]`` and resident bytes ``bytes_[p]`` for ``p = 0..n``."""

    name: str
    rate: float
    latency_s: tuple[float, ...]
    bytes_: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.latency_s) != len(self.bytes_) or not self.latency_s:
            raise ValueError(f"{self.name}: one latency and one size per prefix length 0..n")
        if self.bytes_[0] != 0 or any(
            a > b for a, b in zip(self.bytes_, self.bytes_[1:], strict=False)
        ):
            raise ValueError(f"{self.name}: prefix bytes must start at 0 and not decrease")


@dataclass(frozen=True)
class Residency:
    """The plan: resident prefix per model, its bytes and the expected latency it gives."""

    prefix: dict[str, int]
    bytes_used: int
    expected_latency_s: float  # rate-weighted mean over requests (0 when no rate)
    weighted_latency: float = field(default=0.0)  # sum_m rate_m * latency_m (requests/s * s)


def pipeline_latency(
    copy_s: Sequence[float],
    compute_s: Sequence[float],
    *,
    lookahead: int | None = None,
    window_bytes: int | None = None,
    layer_bytes: Sequence[int] | None = None,
) -> float:
    """Latency of one pass when layer ``i`` needs ``copy_s[i]`` of transfer (one stream, forward
    order) and ``compute_s[i]`` of execution; ``lookahead`` bounds how many layers the transfer
    may run ahead of execution (1: layer ``i+1`` is brought while ``i`` runs; None: unbounded),
    or ``window_bytes`` how many bytes (``layer_bytes`` each; see the module doc)."""
    if len(copy_s) != len(compute_s):
        raise ValueError("one copy time per layer")
    if lookahead is not None and lookahead < 0:
        raise ValueError("lookahead must be >= 0")
    if window_bytes is not None:
        if lookahead is not None or layer_bytes is None or len(layer_bytes) != len(copy_s):
            raise ValueError("a byte window needs layer_bytes, one per layer, and no lookahead")
        return _windowed(copy_s, compute_s, layer_bytes, window_bytes)
    load_end = 0.0
    run_end: list[float] = []
    for i, (c, x) in enumerate(zip(copy_s, compute_s, strict=True)):
        ready = 0.0  # a layer with nothing to bring is ready at once and leaves the stream free
        if c > 0:
            j = i - 1 - lookahead if lookahead is not None else -1
            load_end = max(load_end, run_end[j] if j >= 0 else 0.0) + c
            ready = load_end
        run_end.append(max(run_end[-1] if run_end else 0.0, ready) + x)
    return run_end[-1] if run_end else 0.0


def _windowed(
    copy_s: Sequence[float], compute_s: Sequence[float], nbytes: Sequence[int], window: int
) -> float:
    loaded = [0]  # loaded[k]: bytes of the layers below k that are brought
    for c, b in zip(copy_s, nbytes, strict=True):
        loaded.append(loaded[-1] + (b if c > 0 else 0))
    load_end = 0.0
    run_end: list[float] = []
    for i, (c, x) in enumerate(zip(copy_s, compute_s, strict=True)):
        ready = 0.0
        if c > 0:
            # least k = r + 1 with loaded[i] - loaded[k] (what lies in (r, i)) == 0, or
            # + nbytes[i] <= window; the layer r runs from run_end[r-1] = run_end[k-2]
            k = bisect.bisect_left(loaded, loaded[i] - max(0, window - nbytes[i]), 0, i)
            load_end = max(load_end, run_end[k - 2] if k >= 2 else 0.0) + c
            ready = load_end
        run_end.append(max(run_end[-1] if run_end else 0.0, ready) + x)
    return run_end[-1] if run_end else 0.0


def cold_latency(
    model: ModelLayers,
    prefix: int,
    rate_bps: float,
    *,
    lookahead: int | None = None,
    window_bytes: int | None = None,
) -> float:
    """Latency with the first ``prefix`` layers resident, the rest brought at ``rate_bps``
    (at most ``lookahead`` layers or ``window_bytes`` ahead; neither: unbounded)."""
    if not 0 <= prefix <= len(model.layer_bytes):
        raise ValueError(f"{model.name}: prefix {prefix} outside 0..{len(model.layer_bytes)}")
    if not rate_bps > 0:
        raise ValueError(f"rate must be > 0 bytes/s, got {rate_bps!r}")
    copy = [0.0 if i < prefix else b / rate_bps for i, b in enumerate(model.layer_bytes)]
    return pipeline_latency(
        copy,
        model.compute_s,
        lookahead=lookahead,
        window_bytes=window_bytes,
        layer_bytes=model.layer_bytes,
    )


def latency_curve(
    model: ModelLayers,
    rate_bps: float,
    *,
    lookahead: int | None = None,
    window_bytes: int | None = None,
) -> Curve:
    """The model's :class:`Curve`: cold latency and bytes for every prefix length."""
    n = len(model.layer_bytes)
    lat = [
        cold_latency(model, p, rate_bps, lookahead=lookahead, window_bytes=window_bytes)
        for p in range(n + 1)
    ]
    return Curve(model.name, model.rate, tuple(lat), tuple(model.prefix_bytes()))


def sweet_spot(curve: Curve, tolerance: float = SWEET_SPOT_TOLERANCE) -> int:
    """The smallest prefix whose cold latency is within ``tolerance`` times warm (``p = n``)."""
    warm = curve.latency_s[-1]
    return next(p for p, lat in enumerate(curve.latency_s) if lat <= tolerance * warm + 1e-15)


def plan_residency(
    models: Sequence[ModelLayers],
    rate_bps: float,
    budget_bytes: int,
    *,
    granularity: int | None = None,
    lookahead: int | None = None,
    window_bytes: int | None = None,
) -> Residency:
    """The LCache policy over models whose layers are brought at ``rate_bps`` (see module doc)."""
    curves = [
        latency_curve(m, rate_bps, lookahead=lookahead, window_bytes=window_bytes) for m in models
    ]
    return plan_curves(curves, budget_bytes, granularity=granularity)


def plan_curves(
    curves: Sequence[Curve], budget_bytes: int, *, granularity: int | None = None
) -> Residency:
    """Exact multiple-choice knapsack on a byte grid: one prefix per curve, bytes within budget."""
    if budget_bytes < 0:
        raise ValueError("budget must be >= 0 bytes")
    if len({c.name for c in curves}) != len(curves):
        raise ValueError("model names must be unique")
    g = granularity if granularity is not None else max(1, budget_bytes // GRID_UNITS)
    if g < 1:
        raise ValueError("granularity must be >= 1 byte")
    cap = budget_bytes // g
    inf = math.inf
    best = np.zeros(cap + 1)  # best[u]: least weighted latency of the models so far within u units
    choices: list[np.ndarray] = []
    for c in curves:
        nxt = np.full(cap + 1, inf)
        pick = np.zeros(cap + 1, dtype=np.int64)
        for p, (lat, b) in enumerate(zip(c.latency_s, c.bytes_, strict=True)):
            w = -(-b // g)  # units, rounded up: the plan never exceeds the budget
            if w > cap:
                break
            cand = best[: cap + 1 - w] + c.rate * lat  # for u >= w (u < w: does not fit)
            better = cand < nxt[w:]  # strict: on a tie the shorter prefix stays
            np.copyto(nxt[w:], cand, where=better)  # in place: no full-size temporaries
            np.copyto(pick[w:], p, where=better)
        best = nxt
        choices.append(pick)
    prefix: dict[str, int] = {}
    u = cap
    for c, pick in zip(reversed(curves), reversed(choices), strict=True):
        p = int(pick[u])
        prefix[c.name] = p
        u -= -(-c.bytes_[p] // g)
    prefix = {c.name: prefix[c.name] for c in curves}
    return _residency(curves, prefix)


def _residency(curves: Sequence[Curve], prefix: Mapping[str, int]) -> Residency:
    weighted = sum(c.rate * c.latency_s[prefix[c.name]] for c in curves)
    total_rate = sum(c.rate for c in curves)
    return Residency(
        prefix=dict(prefix),
        bytes_used=sum(c.bytes_[prefix[c.name]] for c in curves),
        expected_latency_s=weighted / total_rate if total_rate > 0 else 0.0,
        weighted_latency=weighted,
    )


def trim_to_budget(
    curves: Sequence[Curve], current: Mapping[str, int], budget_bytes: int
) -> Residency:
    """Evict tail layers until the residency fits: each step drops the tail layer whose loss
    ``rate * (curve[p-1] - curve[p])`` per byte freed is smallest (ties: the larger layer)."""
    prefix = {c.name: current.get(c.name, 0) for c in curves}
    by_name = {c.name: c for c in curves}
    used = sum(c.bytes_[prefix[c.name]] for c in curves)
    while used > budget_bytes:
        best_key: tuple[float, int] | None = None
        victim = ""
        for name, p in prefix.items():
            if p == 0:
                continue
            c = by_name[name]
            freed = c.bytes_[p] - c.bytes_[p - 1]
            loss = c.rate * (c.latency_s[p - 1] - c.latency_s[p])
            key = (loss / freed if freed > 0 else math.inf, -freed)
            if best_key is None or key < best_key:
                best_key, victim = key, name
        if best_key is None:
            break
        c = by_name[victim]
        used -= c.bytes_[prefix[victim]] - c.bytes_[prefix[victim] - 1]
        prefix[victim] -= 1
    return _residency(curves, prefix)


def evictions(current: Mapping[str, int], target: Mapping[str, int]) -> list[tuple[str, int]]:
    """``(model, layer)`` to drop to go from ``current`` to ``target`` prefixes: tail first."""
    return [
        (name, layer)
        for name, p in current.items()
        for layer in range(p - 1, target.get(name, 0) - 1, -1)
    ]


def loads(current: Mapping[str, int], target: Mapping[str, int]) -> list[tuple[str, int]]:
    """``(model, layer)`` to bring in to go from ``current`` to ``target``: front first."""
    return [(name, layer) for name, p in target.items() for layer in range(current.get(name, 0), p)]


@dataclass(frozen=True)
class LruStep:
    """One request under whole-model LRU: the resident models (least recent first) after it."""

    resident: tuple[str, ...]
    hit: bool
    evicted: tuple[str, ...]
    admitted: bool


def lru_access(
    resident: Sequence[str], sizes: Mapping[str, int], budget_bytes: int, name: str
) -> LruStep:
    """A request for ``name``: a hit moves it to most recent; a miss loads the whole model,
    evicting least recently used models until it fits (one larger than the budget is run from
    the slow tier and not admitted, nothing evicted)."""
    if name in resident:
        rest = tuple(m for m in resident if m != name)
        return LruStep((*rest, name), hit=True, evicted=(), admitted=True)
    if sizes[name] > budget_bytes:
        return LruStep(tuple(resident), hit=False, evicted=(), admitted=False)
    kept = list(resident)
    used = sum(sizes[m] for m in kept)
    evicted: list[str] = []
    while kept and used + sizes[name] > budget_bytes:
        victim = kept.pop(0)
        used -= sizes[victim]
        evicted.append(victim)
    return LruStep((*kept, name), hit=False, evicted=tuple(evicted), admitted=True)
