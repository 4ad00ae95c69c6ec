"""A discrete-event simulation of Packrat serving pods, for planning against a latency SLO.

What it models, as the serving code does it:

- **Service** (``spread``): each arrival goes to one replica, ``random`` (kube-proxy's
  iptables mode picks a backend uniformly per connection) or ``round_robin`` (IPVS).
- **Dispatcher** (one per replica, :mod:`packrat.serve.dispatcher.app` and its slots): sends the
  request to the
  instance with the least outstanding work relative to its batch size, ``(n_i + 1) / b_i``
  (ties to the larger batch, then the lower index, as :func:`packrat.serve.dispatcher.routing.
  choose_instance`), at most ``cap_factor * b_i`` outstanding per instance; the rest waits in
  a FIFO queue of at most ``queue_limit`` requests; beyond that the request is shed (503),
  which the simulation records as an infinite latency (an SLO miss).
- **TorchServe instance** (one worker per plan instance): when idle with requests queued it
  starts collecting a batch; the batch runs when it holds ``b_i`` requests or
  ``max_batch_delay_ms`` after collection began, whichever is first, and takes
  ``L(t_i, k)`` ms for ``k`` requests (the profile, linearly interpolated between profiled
  batch sizes, the smallest profiled size's latency below it), times a per-batch factor
  when the service time varies (``service_cv`` or ``service_factors``, below).

**Service-time spread.** A profile holds each point's mean, but a real pod's batches do not
all last that long: its JVM frontend, dispatcher and handler share the cores and the run
time varies from batch to batch. At low load, where queueing is rare, that spread *is* the
tail, so a simulation with constant service times understates P99 there (measured on
ResNet-50: 1.37x at 30% load). ``service_factors`` resamples measured ratios (a batch's
latency over the profile's, e.g. from sequential requests to the pod) per batch;
``service_cv`` draws them from a gamma distribution with mean 1 and that coefficient of
variation (what a profile's per-point ``cv`` gives). Both are seeded.

Arrivals are open-loop (a trace of timestamps). Pure: numpy and heapq, no clock, no I/O;
``random`` spreading is seeded, so a run is a function of its inputs.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

Table = Mapping[tuple[int, int], float]

SPREADS = ("random", "round_robin")


class SimulationError(ValueError):
    """The configuration cannot be simulated (unprofiled instance, bad parameters)."""


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-query latencies (ms, ``inf`` for shed requests) in arrival order."""

    latencies_ms: np.ndarray

    @property
    def queries(self) -> int:
        return int(self.latencies_ms.size)

    @property
    def shed(self) -> int:
        return int(np.isinf(self.latencies_ms).sum())

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile (``inf`` when it falls on a shed request)."""
        return nearest_rank(self.latencies_ms, q)

    @property
    def p99_ms(self) -> float:
        return self.percentile(99.0)

    @property
    def mean_ms(self) -> float:
        return float(self.latencies_ms.mean()) if self.queries else math.nan

    def miss_rate(self, slo_ms: float) -> float:
        """Fraction of queries slower than ``slo_ms`` (shed ones included)."""
        if not self.queries:
            return 0.0
        return float((self.latencies_ms > slo_ms).mean())


def nearest_rank(values: np.ndarray, q: float) -> float:
    """The smallest value with at least q% of ``values`` at or below it; NaN when empty."""
    if values.size == 0:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * values.size))
    return float(np.partition(values, rank - 1)[rank - 1])


def batch_latency_table(table: Table, threads: int, batch: int) -> list[float]:
    """``L(threads, k)`` for k = 0..batch (index 0 unused), interpolated between profiled
    batch sizes; an instance must itself be a profiled pair."""
    if (threads, batch) not in table:
        raise SimulationError(f"instance threads={threads} batch={batch} is not in the profile")
    sizes = sorted(b for (t, b) in table if t == threads and b <= batch)
    xs = np.array(sizes, dtype=float)
    ys = np.array([table[(threads, b)] for b in sizes], dtype=float)
    ks = np.arange(0, batch + 1, dtype=float)
    out = np.interp(ks, xs, ys)
    return [float(v) for v in out]


def service_spread(
    n: int,
    *,
    cv: float = 0.0,
    factors: Sequence[float] | np.ndarray | None = None,
    seed: int = 0,
) -> list[float]:
    """``n`` per-batch service-time factors: resampled from ``factors``, else gamma with
    mean 1 and coefficient of variation ``cv``, else all exactly 1."""
    if cv < 0 or not math.isfinite(cv):
        raise SimulationError(f"service_cv must be finite and >= 0, got {cv}")
    rng = np.random.default_rng([seed, 1])
    if factors is not None:
        pool = np.asarray(factors, dtype=np.float64)
        if pool.ndim != 1 or pool.size == 0 or not np.all(np.isfinite(pool)) or np.any(pool <= 0):
            raise SimulationError("service_factors must be a non-empty list of positive numbers")
        return [float(v) for v in rng.choice(pool, size=n)]
    if cv == 0:
        return [1.0] * n
    shape = 1.0 / (cv * cv)
    return [float(v) for v in rng.gamma(shape, 1.0 / shape, size=n)]


def simulate(
    arrivals_s: np.ndarray | Sequence[float],
    table: Table,
    instances: Sequence[tuple[int, int]],
    *,
    replicas: int = 1,
    spread: str = "random",
    max_batch_delay_ms: float = 5.0,
    cap_factor: int = 2,
    queue_limit: int = 1024,
    overhead_ms: float = 0.0,
    seed: int = 0,
    schedule: Sequence[tuple[float, int]] | None = None,
    service_cv: float = 0.0,
    service_factors: Sequence[float] | np.ndarray | None = None,
) -> SimResult:
    """Simulate ``replicas`` identical pods, each running ``instances`` ``(threads, batch)``,
    on the arrival trace ``arrivals_s`` (sorted seconds). See the module docstring.

    ``schedule`` (``(time_s, replicas)`` steps, the first at or before the first arrival)
    makes the replica count vary, as an autoscaler does: an arrival goes to one of the
    replicas active at its time; a removed replica still finishes what it holds (drain).
    """
    arr = np.asarray(arrivals_s, dtype=np.float64)
    if arr.ndim != 1:
        raise SimulationError("arrivals must be a 1-D array of timestamps")
    if arr.size and (not np.all(np.isfinite(arr)) or np.any(np.diff(arr) < 0)):
        raise SimulationError("arrivals must be finite and sorted")
    if replicas < 1:
        raise SimulationError(f"replicas must be >= 1, got {replicas}")
    if not instances:
        raise SimulationError("a replica needs at least one instance")
    if spread not in SPREADS:
        raise SimulationError(f"spread must be one of {SPREADS}, got {spread!r}")
    if max_batch_delay_ms < 0 or cap_factor < 1 or queue_limit < 0 or overhead_ms < 0:
        raise SimulationError("delay, overhead and queue limit must be >= 0, cap factor >= 1")
    n = int(arr.size)
    factors = service_spread(n, cv=service_cv, factors=service_factors, seed=seed)
    active = np.full(n, replicas, dtype=np.int64)
    if schedule is not None:
        steps = sorted(schedule)
        if not steps or any(k < 1 for _, k in steps) or (n and steps[0][0] > arr[0]):
            raise SimulationError("a schedule needs steps of >= 1 replica from the first arrival")
        at = np.searchsorted(np.array([t for t, _ in steps]), arr, side="right") - 1
        active = np.array([k for _, k in steps], dtype=np.int64)[at]
        replicas = int(max(k for _, k in steps))
    if spread == "random":
        u = np.random.default_rng(seed).random(n)
        target = np.minimum((u * active).astype(np.int64), active - 1)
    else:
        target = np.arange(n) % active
    times = (arr * 1000.0).tolist()
    per_replica = len(instances)
    ordered = sorted(range(per_replica), key=lambda i: (-instances[i][1], i))
    lat_cache = {(t, b): batch_latency_table(table, t, b) for t, b in sorted(set(instances))}
    done = _run(
        times=times,
        target=target.tolist(),
        replicas=replicas,
        batches=[instances[i][1] for i in ordered],
        lats=[lat_cache[(instances[i][0], instances[i][1])] for i in ordered],
        delay=max_batch_delay_ms,
        cap_factor=cap_factor,
        queue_limit=queue_limit,
        factors=factors,
    )
    latencies = np.asarray(done, dtype=np.float64) - (arr * 1000.0) + overhead_ms
    return SimResult(latencies_ms=latencies)


@dataclass(frozen=True, slots=True)
class _Instances:
    """Every instance of every replica, by global index ``g`` (replica ``g // k_per``): its
    batch size, latency by batch size and outstanding cap, and its state in the run."""

    bat: list[int]
    lat: list[list[float]]
    caps: list[int]
    inv: list[float]  # 1 / batch: the routing key is (outstanding + 1) / batch
    outstanding: list[int]  # forwarded here, not answered yet
    pending: list[deque[int]]  # forwarded here, not in a running batch (TorchServe's queue)
    busy: list[bool]
    collecting: list[int]  # token of the open collection; 0 = none
    running: list[list[int]]  # the queries of the running batch


def _instances(
    batches: list[int], lats: list[list[float]], replicas: int, cap_factor: int
) -> _Instances:
    bat = batches * replicas
    total = len(bat)
    return _Instances(
        bat=bat,
        lat=lats * replicas,
        caps=[cap_factor * b for b in bat],
        inv=[1.0 / b for b in bat],
        outstanding=[0] * total,
        pending=[deque() for _ in range(total)],
        busy=[False] * total,
        collecting=[0] * total,
        running=[[] for _ in range(total)],
    )


class _Ops(NamedTuple):
    """The run's steps, closures over its state (one cheap call each): see :func:`_ops`."""

    route: Callable[[int], int]
    start: Callable[[int, bool, float], None]
    complete: Callable[[int, float], None]


def _ops(
    inst: _Instances,
    *,
    k_per: int,
    delay: float,
    heap: list[tuple[float, int, int]],
    factors: list[float],
    waiters: list[deque[int]],
    done: list[float],
) -> _Ops:
    """The steps of the event loop. Their counters (``seq``, the event tokens, and ``nb``,
    the batches started) live in this closure, so a step returns nothing (no tuple per
    event: the steps run once or twice per query of every candidate plan).

    - ``route(base)``: the dispatcher's rule over the replica's instances ``base ..
      base + k_per - 1``: the least ``(n + 1) / b`` under its cap, or -1 when none has room
      (with one instance per replica, just its cap).
    - ``start(g, due, now)``: idle instance ``g`` starts a batch when it is full (or
      ``due``, or there is no batch delay), else begins collecting one.
    - ``complete(g, now)``: ``g``'s batch is answered; what waits in its replica's
      dispatcher queue is forwarded while an instance has room, starting (or collecting)
      batches on the others (``g`` itself starts in the loop).
    """
    bat, lat, caps, inv = inst.bat, inst.lat, inst.caps, inst.inv
    outstanding, pending, busy = inst.outstanding, inst.pending, inst.busy
    collecting, running = inst.collecting, inst.running
    push = heapq.heappush
    inf = math.inf
    collect = delay > 0
    seq = nb = 0

    def route_one(base: int) -> int:
        return base if outstanding[base] < caps[base] else -1

    def route_many(base: int) -> int:
        h = -1
        best_key = inf
        for c in range(base, base + k_per):
            o = outstanding[c]
            if o < caps[c]:
                key = (o + 1) * inv[c]
                if key < best_key:
                    h, best_key = c, key
        return h

    def start(g: int, due: bool, now: float) -> None:
        nonlocal seq, nb
        q = pending[g]
        b = bat[g]
        k = len(q)
        if due or k >= b or not collect:
            if k > b:
                running[g] = [q.popleft() for _ in range(b)]
                k = b
            else:  # the whole queue: one copy, no per-item pops
                running[g] = list(q)
                q.clear()
            busy[g] = True
            collecting[g] = 0
            seq += 1
            push(heap, (now + lat[g][k] * factors[nb], seq, g))
            nb += 1
        elif not collecting[g]:
            seq += 1
            collecting[g] = seq
            push(heap, (now + delay, seq, -g - 1))

    route = route_one if k_per == 1 else route_many

    def complete(g: int, now: float) -> None:
        batch = running[g]
        for qid in batch:
            done[qid] = now
        outstanding[g] -= len(batch)
        busy[g] = False
        w = waiters[g // k_per]
        if not w:
            return
        base = g - g % k_per
        while w:
            h = route(base)
            if h < 0:
                break
            outstanding[h] += 1
            pending[h].append(w.popleft())
            if h != g and not busy[h]:
                start(h, False, now)

    return _Ops(route, start, complete)


def _run(
    *,
    times: list[float],
    target: list[int],
    replicas: int,
    batches: list[int],
    lats: list[list[float]],
    delay: float,
    cap_factor: int,
    queue_limit: int,
    factors: list[float],
) -> list[float]:
    """The event loop. Each turn takes the next event, a collection deadline, a completed
    batch or an arrival, then lets the instance it concerns start a batch (or begin
    collecting one); the steps are :func:`_ops`'s.

    Instances are ordered by (-batch, index) within a replica, so the first minimum of
    ``(n + 1) / b`` found is the routing rule's tie-break winner. A request forwarded to an
    instance is ``outstanding`` there until its batch completes; ``pending`` holds those not
    yet in a running batch (TorchServe's own queue). The j-th batch started lasts its
    profiled latency times ``factors[j]`` (there are at most as many batches as queries).
    """
    inst = _instances(batches, lats, replicas, cap_factor)
    outstanding, pending, busy, collecting = (
        inst.outstanding,
        inst.pending,
        inst.busy,
        inst.collecting,
    )
    k_per = len(batches)
    waiters: list[deque[int]] = [deque() for _ in range(replicas)]
    done = [math.inf] * len(times)
    heap: list[tuple[float, int, int]] = []  # (time, seq, code): code >= 0 done g, < 0 deadline
    route, start, complete = _ops(
        inst, k_per=k_per, delay=delay, heap=heap, factors=factors, waiters=waiters, done=done
    )
    pop = heapq.heappop
    n = len(times)
    i = 0  # the next arrival
    while True:
        if heap and (i >= n or heap[0][0] <= times[i]):
            now, tok, g = pop(heap)
            if g < 0:  # a collection deadline: run what has been collected
                g = -g - 1
                if collecting[g] == tok and not busy[g]:
                    start(g, True, now)
                continue
            complete(g, now)  # a batch completed: answer, refill
            if pending[g]:
                start(g, False, now)
            continue
        if i >= n:
            break
        now = times[i]  # an arrival: to an instance with room, else the queue, else shed
        r = target[i]
        w = waiters[r]
        g = -1 if w else route(r * k_per)
        if g < 0:
            if len(w) < queue_limit:
                w.append(i)
        else:
            outstanding[g] += 1
            pending[g].append(i)
            if not busy[g]:
                start(g, False, now)
        i += 1
    return done
