"""The models a pool process hosts: each a layer file, a mapped model, its counters.

torch is imported once for the whole process; a model is built from its mapped layer file
(architecture without initialisation, every tensor a view of the mapping: no weight byte is
read until a request runs it), so adding a model to a warm pool costs milliseconds, and an
idle model costs only the pages the residency policy leaves it. One request runs at a time
per model; requests for different models run on the pool's compute threads, each with its
model's intra-op threads (its plan on the pool's cores, from the operator: ``threads`` in
the model's config entry; 1 without one), and never more threads at once than the pod has
cores (:class:`Cores`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from packrat.runtime import zoo
from packrat.runtime.layerfile import (
    LayerFile,
    LayerFileError,
    RateLimiter,
    build_mapped,
    measure_read_rate,
    upgrade_layer_file,
    write_layer_file,
)
from packrat.runtime.pinning import reader_split
from packrat.runtime.pipelined import (
    MODES,
    READ_AHEAD_BYTES,
    LayeredModel,
    Mode,
    embedding_layers,
    layer_times,
)
from packrat.serve import codec
from packrat.serve.pool.residency import POLICIES, Policy, ResidencyManager

__all__ = [
    "ConfigError",
    "ModelGoneError",
    "Pool",
    "PoolConfig",
    "PoolModel",
    "SpoiledError",
    "load_config",
]

MAX_MODELS = 512
# issue 38: a name with '"' or a newline wrote its own series into /metrics
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class ConfigError(ValueError):
    """The pool's configuration is malformed."""


class ModelGoneError(LookupError):
    """The model a request names is no longer in the pool (a 404)."""


class SpoiledError(RuntimeError):
    """The model's layer file lost bytes under the pool (a 503 while it is written anew)."""


MAX_THREADS = 256
MAX_BATCH = 1 << 16


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    spec: str
    seed: int | None = None
    threads: int = 1  # intra-op threads per request (the model's plan on the pool's cores)
    batch: int | None = None  # the batch its plan is for (reported)


def _bounded(item: dict[str, Any], key: str, high: int) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigError(f"model {item['name']!r}: {key} must be an integer in 1..{high}")
    return value


@dataclass(frozen=True, slots=True)
class PoolConfig:
    models: tuple[ModelEntry, ...]
    directory: Path
    budget_bytes: int
    policy: Policy = "lcache"
    mode: Mode = "prefetch"
    read_rate_bps: float | None = None
    """A read path slower than the disk (a network volume); None: the disk's own rate."""
    in_place_embeddings: bool = True
    threads: int = 1
    read_ahead_bytes: int = READ_AHEAD_BYTES
    """How far a cold start's reader runs ahead of the compute (bytes; at least one layer)."""
    pin_reader: bool = True
    """Where the pod has a core more than its compute threads: the reader on it alone."""
    digest: str = ""
    """SHA-256 of the config file's bytes, as ``/pool/status`` reports it: the operator moves
    a model's Service here only once the pod serves the config it wrote last."""


def _entry(item: Any) -> ModelEntry:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ConfigError(f"a model needs a name and a spec: {item!r}")
    name, spec, seed = item["name"], item.get("spec"), item.get("seed")
    if not NAME.fullmatch(name):  # it goes into file names, URLs and /metrics labels
        raise ConfigError(f"model {name[:80]!r}: a name is letters, digits, '.', '_', '-'")
    if not isinstance(spec, str) or not zoo.is_zoo_name(spec):
        raise ConfigError(f"model {name!r}: a zoo spec is required ({', '.join(zoo.ZOO_NAMES)})")
    if seed is not None and not isinstance(seed, int):
        raise ConfigError(f"model {name!r}: seed must be an integer")
    threads = _bounded(item, "threads", MAX_THREADS) or 1
    return ModelEntry(name, spec, seed, threads, _bounded(item, "batch", MAX_BATCH))


def load_config(doc: dict[str, Any]) -> PoolConfig:
    """A :class:`PoolConfig` from its JSON form; :class:`ConfigError` says what is wrong."""
    try:
        models = tuple(_entry(m) for m in doc["models"])
        if not 0 < len(models) <= MAX_MODELS or len({m.name for m in models}) != len(models):
            raise ConfigError(f"1..{MAX_MODELS} models with distinct names are required")
        policy, mode = doc.get("policy", "lcache"), doc.get("mode", "prefetch")
        if policy not in POLICIES or mode not in MODES:
            raise ConfigError(f"policy in {POLICIES}, mode in {MODES}")
        rate = doc.get("read_rate_bps")
        budget = int(doc["budget_bytes"])
        ahead = int(doc.get("read_ahead_bytes", READ_AHEAD_BYTES))
        if budget <= 0 or (rate is not None and not float(rate) > 0) or ahead < 0:
            raise ConfigError("budget_bytes and read_rate_bps must be > 0, read_ahead_bytes >= 0")
        return PoolConfig(
            models=models,
            directory=Path(doc["directory"]),
            budget_bytes=budget,
            policy=policy,
            mode=mode,
            read_rate_bps=None if rate is None else float(rate),
            in_place_embeddings=bool(doc.get("in_place_embeddings", True)),
            threads=min(MAX_THREADS, max(1, int(doc.get("threads", 1)))),
            read_ahead_bytes=ahead,
            pin_reader=bool(doc.get("pin_reader", True)),
        )
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"malformed pool configuration: {exc!r}") from None


class Cores:
    """The pod's cores, taken by the requests that run: a request of a model with ``t``
    threads waits until ``t`` (at most all) are free, so wide plans never oversubscribe the
    pod while narrow ones run beside each other. Not FIFO: a wide request can wait behind a
    stream of narrow ones (bounded by the server's request timeout)."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.free = self.total
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, wanted: int) -> Iterator[int]:
        n = max(1, min(wanted, self.total))
        with self._cond:
            self._cond.wait_for(lambda: self.free >= n)
            self.free -= n
        try:
            yield n
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()


@dataclass(slots=True)
class PoolModel:
    name: str
    spec: str
    lm: LayeredModel
    inputs: list[dict[str, Any]]
    build_s: float
    threads: int = 1
    batch: int | None = None
    requests: int = 0
    cold_starts: int = 0
    read_bytes: int = 0
    last_use: float = 0.0
    healing: bool = False  # its spoiled layer file is being written anew
    lock: threading.Lock = field(default_factory=threading.Lock)


def _mapped(entry: ModelEntry, directory: Path) -> tuple[LayerFile, nn.Module]:
    """``entry``'s layer file and its model built on the mapping (nothing read yet).

    The file is this pod's cache of the zoo model's weights: one that is missing, does not
    open or build (a truncated or corrupted store, a header that lies: :class:`LayerFileError`)
    or holds another spec (the model's spec changed under its name) is written anew from the
    spec, once; a file of an older layout is rewritten from its own weights. Before, such a
    file failed every reconfiguration that named the model (its spec changed: forever)."""
    path = directory / f"{entry.name}.layers"
    build = functools.partial(zoo.load_model, entry.spec)  # the architecture (init off)
    example = zoo.example_input(entry.spec, 1)
    for fresh in (not path.exists(), True):
        if fresh:
            model = zoo.load_model(entry.spec, seed=entry.seed)
            write_layer_file(model, path, spec=entry.spec, example=example)
            del model
        lf: LayerFile | None = None
        try:
            lf = LayerFile(path)
            if lf.spec != entry.spec:
                raise LayerFileError(f"{path}: holds {lf.spec[:80]!r}, the model is {entry.spec}")
            lf = upgrade_layer_file(build, lf, example)
            return lf, build_mapped(build, lf)
        except LayerFileError as exc:
            if lf is not None:
                lf.close()
            if fresh:
                raise
            print(f"packrat pool: {exc}; written anew from {entry.spec}", flush=True)
    raise AssertionError("unreachable: the second pass writes the file")


class Pool:
    """Every model of one pool process, the residency manager and the read path."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.cores = Cores(config.threads)
        self.limiter = RateLimiter(config.read_rate_bps)
        split = reader_split(os.sched_getaffinity(0), config.threads) if config.pin_reader else None
        self.compute_cpus: frozenset[int] | None = split[0] if split else None
        self.reader_cpus: frozenset[int] | None = split[1] if split else None
        self.models: dict[str, PoolModel] = {e.name: self._build(e, config) for e in config.models}
        self._reconfiguring = threading.Lock()
        first = next(iter(self.models.values())).lm.lf
        self.disk_bps = measure_read_rate(first, max_bytes=64 << 20)
        self.rate_bps = min(self.disk_bps, config.read_rate_bps or float("inf"))
        self.profile = self._profile()
        for m in self.models.values():
            m.lm.lf.evict_all()  # a cold pool: nothing resident until asked for
        self.residency = ResidencyManager(
            {n: self._shape(m) for n, m in self.models.items()},
            budget_bytes=config.budget_bytes,
            rate_bps=self.rate_bps,
            policy=config.policy,
            read_ahead_bytes=config.read_ahead_bytes,
        )
        self.peak_resident = 0
        self.peak_rss = 0

    def _build(self, entry: ModelEntry, config: PoolConfig) -> PoolModel:
        """A model from its layer file (written first when missing), nothing read yet."""
        start = time.perf_counter()
        lf, model = _mapped(entry, config.directory)
        in_place = embedding_layers(model, lf) if config.in_place_embeddings else ()
        lm = LayeredModel(
            model,
            lf,
            self.limiter,
            in_place=in_place,
            read_ahead_bytes=config.read_ahead_bytes,
            reader_cpus=self.reader_cpus,
        )
        build_s = time.perf_counter() - start
        inputs = zoo.input_spec(entry.spec)
        return PoolModel(entry.name, entry.spec, lm, inputs, build_s, entry.threads, entry.batch)

    def reconfigure(
        self, config: PoolConfig | None, *, rebuild: frozenset[str] = frozenset()
    ) -> tuple[list[str], list[str]]:
        """Serve ``config``'s models from now on: new ones built (cold: nothing resident),
        those it no longer names dropped (their pages evicted), the others untouched and
        serving throughout (their resident prefixes kept), but those in ``rebuild`` (a
        spoiled layer file), built anew. The budget, policy and mode are the new config's.
        ``config`` None: the one served when the lock is ours. Returns (added, removed)."""
        with self._reconfiguring:
            config = self.config if config is None else config
            wanted = {e.name: e for e in config.models}
            kept = {
                n: m
                for n, m in self.models.items()
                if n in wanted and m.spec == wanted[n].spec and n not in rebuild
            }
            built: dict[str, PoolModel] = {}
            try:  # nothing of the new config applies until every new model is built
                for n, e in wanted.items():
                    if n not in kept:
                        built[n] = self._build(e, config)
                        if e.spec not in self.profile:
                            times = layer_times(built[n].lm, zoo.example_input(e.spec, 1))
                            self.profile[e.spec] = times
                        built[n].lm.lf.evict_all()
            except BaseException:
                for m in built.values():
                    m.lm.lf.close()
                raise
            self.config = config
            if config.threads != self.cores.total:
                self.cores = Cores(config.threads)
            for n, m in kept.items():  # a new plan: its threads from the next request on
                m.threads, m.batch = wanted[n].threads, wanted[n].batch
            models = {n: kept.get(n) or built[n] for n in wanted}
            residency = ResidencyManager(
                {n: self._shape(m) for n, m in models.items()},
                budget_bytes=config.budget_bytes,
                rate_bps=self.rate_bps,
                policy=config.policy,
                read_ahead_bytes=config.read_ahead_bytes,
            )
            for n in kept:
                residency.prefix[n] = self.residency.prefix[n]
            gone = [m for n, m in self.models.items() if models.get(n) is not m]  # or replaced
            self.models, self.residency = models, residency  # each one assignment
            for m in gone:
                with m.lock:  # after its requests in flight
                    m.lm.lf.evict_all()
            return sorted(built), sorted(m.name for m in gone if m.name not in models)

    def pin_compute_thread(self) -> None:
        """A compute thread's start: onto the compute cores (none spare: left as it is)."""
        if self.compute_cpus:
            with contextlib.suppress(OSError):  # a cpuset may forbid it: best effort
                os.sched_setaffinity(0, self.compute_cpus)

    def _profile(self) -> dict[str, list[float]]:
        """Per-layer compute seconds, once per architecture (instances differ in weights)."""
        out: dict[str, list[float]] = {}
        for m in self.models.values():
            if m.spec not in out:
                out[m.spec] = layer_times(m.lm, zoo.example_input(m.spec, 1))
        return out

    def _shape(self, m: PoolModel) -> tuple[list[int], list[float]]:
        sizes = [0 if i in m.lm.in_place else la.length for i, la in enumerate(m.lm.lf.layers)]
        return sizes, self.profile[m.spec]

    def _apply(self, evictions: Sequence[tuple[str, int]]) -> None:
        models = self.models
        for name, layer in evictions:
            if name in models:  # not one reconfigure dropped meanwhile
                models[name].lm.lf.evict(layer)

    def infer(self, name: str, bodies: Sequence[bytes]) -> list[str]:
        """Run ``bodies`` (one sample each) through ``name`` as one batch; JSON rows back.
        Raises :class:`codec.CodecError` for a body that does not decode."""
        m = self.models.get(name)
        if m is None:  # dropped by a reconfigure since the request was routed
            raise ModelGoneError(f"model {name!r} is not in this pool")
        samples = [codec.decode_sample(b, m.inputs) for b in bodies]
        batch = [torch.stack([s[k] for s in samples]) for k in range(len(m.inputs))]
        x = batch[0] if len(batch) == 1 else tuple(batch)
        residency = self.residency  # the one this request started with (reconfigure)
        with m.lock, self.cores.take(m.threads) as threads:
            if not m.lm.lf.intact():  # truncated under us: touching it would SIGBUS the pool
                self._heal(m)
                raise SpoiledError(
                    f"model {name!r}: its layer file lost bytes under the pool; it is being "
                    "written anew, retry"
                )
            torch.set_num_threads(threads)  # this compute thread's intra-op threads
            self._apply(residency.before(name))
            try:
                out, stats = m.lm(x, self.config.mode)
            finally:
                self._apply(residency.after(name))
            m.requests += 1
            m.cold_starts += stats.missing_layers > 0
            m.read_bytes += stats.read_bytes
            m.last_use = time.time()
        return [codec.encode_output(out, row) for row in range(len(bodies))]

    def _heal(self, m: PoolModel) -> None:
        """Write ``m``'s spoiled layer file anew and build it again, in the background (its
        requests are 503s meanwhile; the other models serve on)."""
        if m.healing:
            return
        m.healing = True
        print(f"packrat pool: {m.lm.lf.path}: lost bytes under the pool; written anew", flush=True)

        def rebuild() -> None:
            try:
                self.reconfigure(None, rebuild=frozenset({m.name}))
            except Exception as exc:  # the next request tries again
                print(f"packrat pool: {m.name}: rebuilding failed: {exc}", flush=True)
                m.healing = False

        threading.Thread(target=rebuild, name=f"heal-{m.name}", daemon=True).start()

    def resident_bytes(self) -> dict[str, int]:
        """Per model, bytes of its file in the page cache now (mincore)."""
        return {n: sum(m.lm.lf.resident_layers()) for n, m in self.models.items()}

    def sample_memory(self) -> tuple[int, int]:
        """(weights resident, process RSS) now; the peaks are kept."""
        resident = sum(self.resident_bytes().values())
        rss = _rss()
        self.peak_resident = max(self.peak_resident, resident)
        self.peak_rss = max(self.peak_rss, rss)
        return resident, rss

    def status(self) -> dict[str, Any]:
        # One reading of the models and their residency: a reconfigure swaps both meanwhile
        # (before, a model added between two readings was a KeyError: /metrics answered 500).
        models, residency = self.models, self.residency
        resident = {n: sum(m.lm.lf.resident_layers()) for n, m in models.items()}
        total, rss = self.sample_memory()
        return {
            "config_digest": self.config.digest,
            "policy": self.config.policy,
            "mode": self.config.mode,
            "budget_bytes": self.config.budget_bytes,
            "disk_read_bps": self.disk_bps,
            "read_rate_bps": self.rate_bps,
            "read_ahead_bytes": self.config.read_ahead_bytes,
            "reader_cpus": sorted(self.reader_cpus or ()),
            "resident_bytes": total,
            "rss_bytes": rss,
            "peak_resident_bytes": self.peak_resident,
            "peak_rss_bytes": self.peak_rss,
            "models": {
                n: {
                    "spec": m.spec,
                    "resident_bytes": resident[n],
                    "file_bytes": m.lm.lf.total_bytes,
                    "resident_layers": residency.prefix.get(n, 0),
                    "layers": len(m.lm.lf.layers),
                    "threads": m.threads,
                    "batch": m.batch,
                    "requests": m.requests,
                    "cold_starts": m.cold_starts,
                    "read_bytes": m.read_bytes,
                    "last_use": m.last_use,
                    "build_s": m.build_s,
                }
                for n, m in models.items()
            },
        }


def _rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


CONFIG_MAX_BYTES = 1 << 20
"""A pool's config file is at most 1 MiB (512 models take about 40 KB)."""


def read_config(path: Path) -> PoolConfig:
    """The config file at ``path``; :class:`ConfigError` (one line) for one that cannot be
    read, is larger than :data:`CONFIG_MAX_BYTES` or is not a valid configuration."""
    try:
        with path.open("rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) > CONFIG_MAX_BYTES:
            raise ConfigError(f"{path}: larger than {CONFIG_MAX_BYTES} bytes")
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a JSON object is required")
    base = doc.get("directory")
    if isinstance(base, str) and not os.path.isabs(base):
        doc["directory"] = str(path.parent / base)
    return dataclasses.replace(load_config(doc), digest=hashlib.sha256(raw).hexdigest())
