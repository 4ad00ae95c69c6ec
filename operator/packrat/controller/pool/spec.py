"""A PackratPool read once per pass: validated, defaulted and typed (as the CRD says, not
trusting that a stored object passed the CRD's checks), and which PackratModels it hosts.

A model is a member of the pool named by its ``spec.pool`` (same namespace). A model that
left the pool (``spec.pool`` changed or removed) stays hosted while its status says the
pool still serves it (``status.pool.name``): its Service points at a pool pod until its own
pods answer ready (no request fails during the move).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from packrat.controller.api.drift import quantity
from packrat.controller.core.model import InvalidSpec
from packrat.controller.core.spec import validate_spec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A pool's name is its Service's (a DNS-1035 label: a letter first, no dots) and the start
# of its pods' label value ``<pool>-<i>`` (at most 63 characters, i up to 63): 60 at most.
POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,58}[a-z0-9])?$")
MAX_POOL_NAME = 60
ENGINES = ("eager", "onnxruntime", "openvino", "inductor")
POLICIES = ("lcache", "lru")
MODES = ("prefetch", "load", "demand")
MAX_REPLICAS = 64
MAX_MODELS = 256  # the pool process's own cap is larger (serve/pool/host.MAX_MODELS)
_FIELDS = {"cpus", "memory", "replicas", "weightBudget", "engines", "policy", "mode", "image"}

# The weight bytes of a zoo model before a pool pod has measured its layer file (an
# estimate for the first placement; the pods' ``file_bytes`` replaces it once read).
ZOO_WEIGHT_BYTES = {
    "resnet50": 102_600_000,
    "inception_v3": 95_400_000,
    "bert-base": 438_000_000,
    "gpt2": 498_000_000,
    "tiny": 1 << 21,
}


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One PackratPool's spec, typed."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    cpus: int
    memory: str
    replicas: int
    budget_bytes: int
    engines: tuple[str, ...]
    policy: str
    mode: str
    image: str | None

    def owner(self) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """A member's plan on the pool's cores (its ``status.poolPlan``, checked): the threads
    the pool pod runs its requests with, its batch, its profiled batch-1 latency on them."""

    threads: int
    batch: int
    batch1_ms: float | None

    def entry(self) -> dict[str, Any]:
        """The model's fields in the pool pod's config."""
        return {"threads": self.threads, "batch": self.batch}


MAX_LATENCY_MS = 3_600_000.0
MAX_BATCH = 1 << 16


def pool_plan_of(model: Mapping[str, Any], pool: str, cpus: int) -> PoolPlan | None:
    """The model's ``status.poolPlan`` when it was made for this pool's ``cpus`` and every
    value is in range (a status is writable by whoever may write status: checked)."""
    record = (model.get("status") or {}).get("poolPlan")
    if not isinstance(record, Mapping) or record.get("pool") != pool or record.get("cpus") != cpus:
        return None
    threads, batch = _int_in(record.get("threads"), cpus), _int_in(record.get("batch"), MAX_BATCH)
    if threads is None or batch is None:
        return None
    latency = record.get("batch1LatencyMs")
    number = isinstance(latency, int | float) and not isinstance(latency, bool)
    ms = float(latency) if number and isinstance(latency, int | float) else None
    if ms is not None and not 0 < ms <= MAX_LATENCY_MS:  # NaN fails too
        ms = None
    return PoolPlan(threads, batch, ms)


def _int_in(value: Any, high: int) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high
    return int(value) if ok else None


@dataclass(frozen=True, slots=True)
class Member:
    """A PackratModel the pool hosts: its name, zoo architecture and uid."""

    name: str
    zoo: str | None  # None: not placed (``problem`` says why)
    leaving: bool = False  # spec.pool no longer names this pool; served until its pods answer
    problem: str | None = None
    plan: PoolPlan | None = None  # its plan on the pool's cores, once made

    @property
    def placeable(self) -> bool:
        return self.zoo is not None and not self.leaving


def _bytes(value: Any, where: str, errors: list[str]) -> int:
    try:
        amount = quantity(value)
    except (TypeError, ValueError):
        amount = None
    if amount is None or not amount > 0:
        errors.append(f"{where}: a positive quantity is required (e.g. 2Gi), got {value!r}")
        return 0
    return int(Decimal(amount))


def _choice(spec: Mapping[str, Any], key: str, allowed: Sequence[str], errors: list[str]) -> str:
    value = spec.get(key, allowed[0])
    if value not in allowed:
        errors.append(f"spec.{key}: one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _int(spec: Mapping[str, Any], key: str, low: int, high: int, errors: list[str]) -> int:
    value = spec.get(key, low)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors.append(f"spec.{key}: an integer in [{low}, {high}], got {value!r}")
        return low
    return value


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    """The typed spec; :class:`InvalidSpec` lists every problem."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidSpec(["spec: an object is required"])
    errors = [f"spec.{k}: unknown field" for k in sorted(set(spec) - _FIELDS)]
    name = meta.get("name")
    if not (isinstance(name, str) and POOL_NAME.fullmatch(name)):
        errors.append(
            f"metadata.name must be a DNS label of at most {MAX_POOL_NAME} characters starting "
            f"with a letter (the pool's Service and its pods' <pool>-<i> labels), got {name!r}"
        )
    cpus = _int(spec, "cpus", 1, 256, errors)
    replicas = _int({"replicas": 1, **spec}, "replicas", 0, MAX_REPLICAS, errors)
    memory = spec.get("memory", "2Gi")
    memory_bytes = _bytes(memory, "spec.memory", errors)
    budget = _bytes(spec.get("weightBudget"), "spec.weightBudget", errors)
    if budget and memory_bytes and budget >= memory_bytes:
        errors.append("spec.weightBudget must be below spec.memory (the process needs room)")
    engines = spec.get("engines", ["eager"])
    if not isinstance(engines, list) or not engines or not set(engines) <= set(ENGINES):
        errors.append(f"spec.engines: a non-empty list of {', '.join(ENGINES)}")
        engines = ["eager"]
    policy = _choice(spec, "policy", POLICIES, errors)
    mode = _choice(spec, "mode", MODES, errors)
    image = spec.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        errors.append("spec.image: a non-empty string")
    if errors:
        raise InvalidSpec(errors)
    generation = meta.get("generation")
    return PoolSpec(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        uid=meta.get("uid"),
        generation=generation if isinstance(generation, int) else None,
        cpus=cpus,
        memory=str(memory),
        replicas=replicas,
        budget_bytes=budget,
        engines=tuple(str(e) for e in engines),
        policy=policy,
        mode=mode,
        image=image,
    )


def pool_of(model: Mapping[str, Any]) -> str | None:
    """The pool a PackratModel asks for (``spec.pool``), if any."""
    name = (model.get("spec") or {}).get("pool")
    return name if isinstance(name, str) and name else None


def served_by(model: Mapping[str, Any]) -> str | None:
    """The pool that serves the model now (``status.pool.name``), if any."""
    record = (model.get("status") or {}).get("pool")
    name = record.get("name") if isinstance(record, Mapping) else None
    return name if isinstance(name, str) and name else None


def _first_come(obj: Mapping[str, Any], pool: str) -> tuple[bool, str, str]:
    """Who keeps a place in a full pool: the models it serves now, then the oldest."""
    meta = obj.get("metadata") or {}
    created = meta.get("creationTimestamp")
    return (served_by(obj) != pool, str(created or ""), str(meta.get("name")))


def members(
    pool: str, models: Sequence[Mapping[str, Any]], *, cpus: int | None = None
) -> list[Member]:
    """The models ``pool`` hosts, by name: those asking for it and those it still serves
    (with their plans on ``cpus`` cores, when given). Past ``MAX_MODELS`` the models it
    serves now and then the oldest keep their places; the rest are members with a problem
    (unplaced, saying why): a flood of new models never pushes out one it serves."""
    ranked = sorted(
        (
            obj
            for obj in models
            if pool in (pool_of(obj), served_by(obj))
            and not (obj.get("metadata") or {}).get("deletionTimestamp")
        ),
        key=lambda obj: _first_come(obj, pool),
    )
    out = [_member(pool, obj, cpus) for obj in ranked[:MAX_MODELS]]
    full = f"the pool hosts at most {MAX_MODELS} models (those it serves, then the oldest)"
    for obj in ranked[MAX_MODELS:]:
        name, leaving = str(obj["metadata"]["name"]), pool_of(obj) != pool
        out.append(Member(name=name, zoo=None, leaving=leaving, problem=full))
    return sorted(out, key=lambda m: m.name)


def _member(pool: str, obj: Mapping[str, Any], cpus: int | None) -> Member:
    """One model asking for ``pool`` or served by it, as a member."""
    name = str(obj["metadata"]["name"])
    source = (obj.get("spec") or {}).get("model") or {}
    zoo = source.get("zoo") if isinstance(source, Mapping) else None
    if not (isinstance(zoo, str) and zoo in ZOO_WEIGHT_BYTES):
        zoo, problem = None, "the pool hosts zoo models only (spec.model.zoo)"
    elif errors := validate_spec(obj.get("spec"), name=name):
        zoo, problem = None, f"the model's spec is invalid: {errors[0]}"
    else:
        problem = None
    plan = pool_plan_of(obj, pool, cpus) if cpus is not None else None
    return Member(name=name, zoo=zoo, leaving=pool_of(obj) != pool, problem=problem, plan=plan)
