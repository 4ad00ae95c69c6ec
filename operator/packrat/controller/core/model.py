"""A PackratModel read once per pass: validated, defaulted, image resolved, typed, keys derived.

A pipeline's stage model also carries ``packrat.dev/serving-cpus``, set by its
PackratPipeline: the CPUs per replica the pipeline planner chose. The model is profiled on
``spec.cpus`` (the profile covers every thread count up to it) and serves on that many, as
a model with ``spec.slo`` serves on the replica size its own planner chose; so a smaller
replica size needs no second profile. Until the pipeline has planned every stage, a stage
model also carries ``packrat.dev/profile-only: "true"``: it profiles itself but deploys
nothing, so its first Deployment is the planned one (no switch away from a placeholder).

``parse`` turns the stored object into a frozen, typed ``ModelSpec`` or raises
``InvalidSpec`` with every problem found, whatever the input's shape (the operator must not
trust that a stored object passed the CRD: validation may be off, the CRD older, or the API
an emulator). ``stored`` types a spec kept in status (``status.servingSpec``, the last good
configuration) the same way. Both go through the one defaulter
(:func:`packrat.controller.core.spec.read_spec`) and resolve the image once; every builder
and step takes the ``ModelSpec`` and never re-reads or re-defaults the raw object. Each
option is typed once, here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from packrat.controller.api.frozen import freeze, thaw
from packrat.controller.core.model_source import ModelSource
from packrat.controller.core.options.canary import CanarySettings, canary_settings
from packrat.controller.core.options.request_logging import RequestLogging, request_logging
from packrat.controller.core.slo_spec import Autoscaling, Slo, TunerReference, spec_reference
from packrat.controller.core.spec import (
    API_VERSION,
    DEFAULT_IMAGE,
    DEFAULT_ROUNDING,
    KIND,
    digest,
    model_identity,
    read_spec,
)
from packrat.plan.optimizer import Plan

SERVING_CPUS_ANNOTATION = "packrat.dev/serving-cpus"
PROFILE_ONLY_ANNOTATION = "packrat.dev/profile-only"


class InvalidSpec(Exception):  # noqa: N818 (the condition reason users see)
    """The spec cannot be served; ``errors`` lists every reason."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Profiling:
    """``spec.profiling``, defaulted."""

    max_batch: int
    threads: tuple[int, ...] | None
    precision: float
    time_budget_seconds: int
    timeout_seconds: int
    backoff_limit: int
    allow_contended: bool
    verify: bool
    mode: str = "co-located"  # how each point is measured: co-located | alone


@dataclass(frozen=True, slots=True)
class AutoBatch:
    """``spec.autoBatch``, defaulted."""

    min: int
    max: int
    sustain_observations: int
    min_interval_seconds: float
    min_gain: float
    rounding: str
    sustain_seconds: float = 1.0
    """The fast trigger (``plan.reconfig.fast_trigger``): decide at once on an estimate the
    pods have held this long, or on frequent batch timeouts; 0: off (the default 1, the
    Packrat paper's 1 s timeout)."""


@dataclass(frozen=True, slots=True)
class SwitchTiming:
    """``spec.switch``, defaulted."""

    ready_timeout_seconds: float
    drain_seconds: float


@dataclass(frozen=True)
class ModelSpec:
    """One PackratModel as a pass sees it: the spec with defaults, the image resolved, every
    option typed. ``spec`` is the defaulted spec as given (read-only; ``image`` only when the
    user set one): what hashes and the pipeline's stage models are built from."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: Mapping[str, Any]
    image: str
    annotations: Mapping[str, str]
    # every option, typed once (from ``spec``, by ``_options``)
    cpus: int
    memory: str
    replicas: int
    batch_size: int | None
    auto: AutoBatch | None
    max_batch_delay_ms: int
    runtime: str | None  # packrat serve --runtime; None: the pods' own default
    profiling: Profiling
    switch: SwitchTiming
    source: ModelSource  # spec.model, typed
    slo: Slo | None  # spec.slo, typed with its defaults
    autoscaling: Autoscaling | None  # spec.autoscaling, typed with its defaults
    reference: TunerReference | None  # spec.autoscaling.reference (a pipeline stage's)
    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]]
    affinity: Mapping[str, Any]
    pod: Mapping[str, Any] | None  # spec.pod overrides
    request_logging: RequestLogging | None
    canary: CanarySettings | None
    # spec.engines when it asks for more than eager (None: eager only, the form of before);
    # ("all",) is every engine installed in the image
    engines: tuple[str, ...] | None
    # spec.artefactsClaim: a ReadWriteMany claim the profiling Job and every pod share for
    # the artefacts (None: each its own emptyDir)
    artefacts_claim: str | None
    pool: str | None = None  # spec.pool: the PackratPool serving it (same namespace)

    # -- derived ---------------------------------------------------------------------------
    @property
    def serving_cpus(self) -> int | None:
        """CPUs per serving replica set by the owning pipeline, if any (at most ``cpus``)."""
        value = self.annotations.get(SERVING_CPUS_ANNOTATION)
        return int(value) if value is not None else None

    @property
    def profile_only(self) -> bool:
        """Set by the owning pipeline until it has planned: profile, but deploy nothing."""
        return self.annotations.get(PROFILE_ONLY_ANNOTATION) == "true"

    @property
    def fixed_batch(self) -> int:
        """The batch size to plan for: the fixed one, or the automatic range's minimum (with
        an SLO the planner's batch replaces it)."""
        if self.batch_size is not None:
            return self.batch_size
        return self.auto.min if self.auto is not None else 1

    @property
    def rounding(self) -> str:
        """The autoBatch estimate's rounding (the pods' default without autoBatch)."""
        return self.auto.rounding if self.auto is not None else DEFAULT_ROUNDING

    @property
    def model_name(self) -> str:
        """The name in ``/predictions/{name}``."""
        return self.source.name or self.name

    @property
    def profile_key(self) -> str:
        """The key a profile is reused under: model, image (torch build), T, grid, node
        selection. The CPU model a profile was measured on is only known after profiling; the
        node selector (and affinity) stand for it here, and the measured CPU model is recorded
        in the ConfigMap."""
        threads = self.profiling.threads or tuple(range(1, self.cpus + 1))
        key: dict[str, Any] = {
            "model": model_identity(self.source.doc),
            "image": self.image,
            "cpus": self.cpus,
            "maxBatch": self.profiling.max_batch,
            "threads": sorted(threads),
            "mode": self.profiling.mode,  # a co-located profile is not an alone one
            "nodeSelector": thaw(self.node_selector),
            "affinity": thaw(self.affinity),
            **({"engines": list(self.engines)} if self.engines else {}),
        }
        sample = self.source.sample_request
        if sample is not None:  # the profile is measured through the handler with this request
            key["sampleRequest"] = hashlib.sha256(sample.encode()).hexdigest()
            key["sampleContentType"] = self.source.sample_content_type
        return digest(key)

    def serving_hash(self, plan: Plan | Mapping[str, Any]) -> str:
        """Hash of everything a slot serves (``status.servingHash``): the plan (its cores,
        batch and instances) and every spec field the pods are built from, except the replica
        count. A different hash needs a switch: in place
        (:mod:`packrat.controller.switch.plan_poster`) when only the plan's layout changed
        (same :meth:`template_hash`), else to the other slot."""
        if isinstance(plan, Plan):
            plan = {
                "cpus": plan.cpus,
                "batch": plan.batch,
                "instances": plan.to_dict()["instances"],
            }
        return digest(
            {
                "plan": {k: plan.get(k) for k in ("cpus", "batch", "instances")},
                "model": thaw(self.source.doc),
                "image": self.image,
                "memory": self.memory,
                "maxBatchDelayMs": self.max_batch_delay_ms,
                "nodeSelector": thaw(self.node_selector),
                "tolerations": thaw(self.tolerations),
                "affinity": thaw(self.affinity),
                **({"pod": thaw(self.pod)} if self.pod else {}),
                **({"rounding": r} if (r := self.rounding) != DEFAULT_ROUNDING else {}),
                # the serving pods' command carries it (absent: the hashes of before)
                **({"requestLogging": asdict(rl)} if (rl := self.request_logging) else {}),
                **({"runtime": self.runtime} if self.runtime else {}),
                # the pods convert and load these engines' artefacts (absent: eager only)
                **({"engines": list(self.engines)} if self.engines else {}),
                **({"artefactsClaim": c} if (c := self.artefacts_claim) else {}),
            }
        )[:16]

    def template_hash(self, cpus: Any) -> str:
        """Hash of what the serving pod template is built from: :meth:`serving_hash` with the
        plan reduced to its cores. The plan itself reaches the pods through the slot's plan
        ConfigMap, so a plan change that keeps the cores leaves the template (and the pods) as
        they are."""
        return self.serving_hash({"cpus": cpus})

    # -- variants and forms ------------------------------------------------------------------
    def with_spec(self, **changes: Any) -> ModelSpec:
        """This model with top-level spec fields replaced (values already valid and defaulted:
        the planner's CPUs, the store's version of the model)."""
        return _make(_meta(self), {**thaw(self.spec), **changes}, image=self.image)

    def on_cpus(self, cpus: int) -> ModelSpec:
        """This model served on ``cpus`` CPUs per replica (the planner's replica size)."""
        return self if cpus == self.cpus else self.with_spec(cpus=cpus)

    def owner(self) -> dict[str, Any]:
        """The owner object the manifest builders reference (name, namespace, uid)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid or ""},
        }

    def stored_spec(self) -> dict[str, Any]:
        """The spec as kept in ``status.servingSpec`` (last good), image resolved."""
        return {**thaw(self.spec), "image": self.image}

    def body(self) -> dict[str, Any]:
        """The whole object (owner metadata and the stored spec), as plain data."""
        return {**self.owner(), "spec": self.stored_spec()}


def _options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of a defaulted, valid ``spec``, typed."""
    prof = spec["profiling"]
    auto = spec.get("autoBatch")
    switch = spec["switch"]
    threads = prof.get("threads")
    slo, autoscaling = spec.get("slo"), spec.get("autoscaling")
    return {
        "cpus": int(spec["cpus"]),
        "memory": str(spec["memory"]),
        "replicas": int(spec["replicas"]),
        "batch_size": int(spec["batchSize"]) if "batchSize" in spec else None,
        "auto": (
            AutoBatch(
                min=int(auto["min"]),
                max=int(auto["max"]),
                sustain_observations=int(auto["sustainObservations"]),
                min_interval_seconds=float(auto["minIntervalSeconds"]),
                min_gain=float(auto["minGain"]),
                rounding=str(auto.get("rounding") or DEFAULT_ROUNDING),
                sustain_seconds=float(auto["sustainSeconds"]),
            )
            if isinstance(auto, Mapping)
            else None
        ),
        "max_batch_delay_ms": int(spec["maxBatchDelayMs"]),
        "runtime": str(spec["runtime"]) if spec.get("runtime") else None,
        "profiling": Profiling(
            max_batch=int(prof["maxBatch"]),
            threads=tuple(int(t) for t in threads) if threads else None,
            precision=float(prof["precision"]),
            time_budget_seconds=int(prof["timeBudgetSeconds"]),
            timeout_seconds=int(prof["timeoutSeconds"]),
            backoff_limit=int(prof["backoffLimit"]),
            allow_contended=bool(prof.get("allowContended")),
            verify=prof.get("verify") is not False,
            mode=str(prof.get("mode") or "co-located"),
        ),
        "switch": SwitchTiming(
            ready_timeout_seconds=float(switch["readyTimeoutSeconds"]),
            drain_seconds=float(switch["drainSeconds"]),
        ),
        "source": ModelSource.of(spec["model"]),
        "slo": Slo.of(slo) if isinstance(slo, Mapping) else None,
        "autoscaling": Autoscaling.of(autoscaling) if isinstance(autoscaling, Mapping) else None,
        "reference": spec_reference(spec),
        "node_selector": spec.get("nodeSelector") or MappingProxyType({}),
        "tolerations": tuple(spec.get("tolerations") or ()),
        "affinity": spec.get("affinity") or MappingProxyType({}),
        "pod": spec.get("pod") or None,
        "request_logging": request_logging(spec),
        "canary": canary_settings(spec),
        "engines": _engines(spec.get("engines")),
        "artefacts_claim": str(spec["artefactsClaim"]) if spec.get("artefactsClaim") else None,
        "pool": str(spec["pool"]) if spec.get("pool") else None,
    }


def _engines(given: Any) -> tuple[str, ...] | None:
    """``spec.engines`` (valid), or None when it asks for eager only."""
    if not given or list(given) == ["eager"]:
        return None
    return tuple(str(e) for e in given)


def _make(
    meta: Mapping[str, Any], spec: Mapping[str, Any], *, image: str, name: str | None = None
) -> ModelSpec:
    generation = meta.get("generation")
    frozen = freeze(spec)
    return ModelSpec(
        name=name if name is not None else str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        uid=meta.get("uid"),
        generation=int(generation) if isinstance(generation, int) else None,
        spec=frozen,
        image=image,
        annotations=MappingProxyType(dict(meta.get("annotations") or {})),
        **_options(frozen),
    )


def _meta(model: ModelSpec) -> dict[str, Any]:
    return {
        "name": model.name,
        "namespace": model.namespace,
        "uid": model.uid,
        "generation": model.generation,
        "annotations": model.annotations,
    }


def read(
    raw: Any, *, default_image: str, meta: Mapping[str, Any] | None = None, name: str | None = None
) -> tuple[ModelSpec | None, list[str]]:
    """(the typed spec, []) or (None, every problem) for a raw spec; ``meta``: the object's
    metadata (name, namespace, uid, generation, annotations); ``name`` checks it as the
    object's name."""
    try:
        spec, errors = read_spec(raw, name=name)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        return None, [f"spec could not be read: {type(exc).__name__}: {exc}"[:500]]
    if errors:
        return None, errors
    image = str(spec.pop("image", None) or default_image)
    if raw.get("image"):
        spec["image"] = image  # as given
    return _make(meta or {"name": name or ""}, spec, image=image, name=name), []


def parse(obj: Mapping[str, Any], *, default_image: str = DEFAULT_IMAGE) -> ModelSpec:
    """Validate, default and type ``obj``'s spec; ``InvalidSpec`` for any problem, never
    another error."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    model, errors = read(obj.get("spec"), default_image=default_image, meta=meta, name=name)
    annotations = dict(meta.get("annotations") or {})
    serving = annotations.get(SERVING_CPUS_ANNOTATION)
    if (
        serving is not None
        and model is not None
        and not (
            isinstance(serving, str)
            and serving.isascii()
            and serving.isdigit()
            and 1 <= int(serving) <= model.cpus
        )
    ):
        errors.append(
            f"annotation {SERVING_CPUS_ANNOTATION} must be an integer in 1..spec.cpus "
            f"({model.cpus}), got {serving!r}"
        )
    if errors or model is None:
        raise InvalidSpec(errors or ["spec unreadable"])
    return model


_SOURCE_META = ("name", "namespace", "uid", "generation", "annotations")


@dataclass(frozen=True)
class Parsed:
    """A typed spec and what it was parsed from, so that a later read of the same object in
    the same pass (the daemon's body, then the pass's own GET) is not parsed again."""

    source: Any
    model: ModelSpec

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, default_image: str) -> Parsed:
        """``obj`` parsed (``InvalidSpec`` as :func:`parse`)."""
        model = parse(obj, default_image=default_image)
        return cls(source=_source(obj, default_image), model=model)


def _source(obj: Mapping[str, Any], default_image: str) -> Any:
    """What :func:`parse` reads of ``obj``, as plain data."""
    meta = obj.get("metadata") or {}
    return thaw([obj.get("spec"), [meta.get(k) for k in _SOURCE_META], default_image])


def parse_again(
    obj: Mapping[str, Any], *, default_image: str, known: Parsed | None = None
) -> ModelSpec:
    """:func:`parse`, or ``known``'s model when ``obj`` is what it was parsed from."""
    if known is not None and known.source == _source(obj, default_image):
        return known.model
    return parse(obj, default_image=default_image)


def stored(
    like: ModelSpec | Mapping[str, Any], spec: Mapping[str, Any], *, image: str
) -> ModelSpec:
    """A spec kept in status (``status.servingSpec``: valid when it was stored, image
    resolved) typed for the object ``like`` (a ModelSpec or the object's metadata);
    ``image`` is the fallback when it names none (older operators)."""
    defaulted, _ = read_spec(spec)
    resolved = str(defaulted.get("image") or image)
    return _make(_meta(like) if isinstance(like, ModelSpec) else like, defaulted, image=resolved)


def model_spec(
    spec: Mapping[str, Any],
    *,
    name: str = "m",
    namespace: str = "default",
    uid: str | None = None,
    image: str = DEFAULT_IMAGE,
    annotations: Mapping[str, str] | None = None,
) -> ModelSpec:
    """``parse`` for a spec on its own (scripts, benchmarks, tests): the object is made up
    from ``name``, ``namespace``, ``uid`` and ``annotations``; ``InvalidSpec`` when invalid."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return parse({"metadata": meta, "spec": spec}, default_image=image)
