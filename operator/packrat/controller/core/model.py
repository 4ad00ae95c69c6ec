"""A PackratModel read once per pass: validated, defaulted, image resolved, keys derived.

A pipeline's stage model also carries ``packrat.dev/serving-cpus``, set by its
PackratPipeline: the CPUs per replica the pipeline planner chose. The model is profiled on
``spec.cpus`` (the profile covers every thread count up to it) and serves on that many, as
a model with ``spec.slo`` serves on the replica size its own planner chose; so a smaller
replica size needs no second profile. Until the pipeline has planned every stage, a stage
model also carries ``packrat.dev/profile-only: "true"``: it profiles itself but deploys
nothing, so its first Deployment is the planned one (no switch away from a placeholder).

``parse`` turns the stored object into a frozen ``ModelSpec`` or raises ``InvalidSpec``
with every problem found, whatever the input's shape (the operator must not trust that a
stored object passed the CRD: validation may be off, the CRD older, or the API an
emulator). Every later step reads the spec from here, never from the raw object.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packrat.controller.core.spec import (
    API_VERSION,
    KIND,
    initial_batch,
    profile_key,
    validate_spec,
    with_defaults,
)

SERVING_CPUS_ANNOTATION = "packrat.dev/serving-cpus"
PROFILE_ONLY_ANNOTATION = "packrat.dev/profile-only"


class InvalidSpec(Exception):  # noqa: N818 (the condition reason users see)
    """The spec cannot be served; ``errors`` lists every reason."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class ModelSpec:
    """One PackratModel as a pass sees it (the spec with defaults and the image filled in)."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: Mapping[str, Any]
    image: str
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return int(self.spec["replicas"])

    @property
    def cpus(self) -> int:
        return int(self.spec["cpus"])

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
    def auto(self) -> Mapping[str, Any] | None:
        auto = self.spec.get("autoBatch")
        return auto if isinstance(auto, Mapping) else None

    @property
    def fixed_batch(self) -> int:
        return initial_batch(self.spec)

    @property
    def profile_key(self) -> str:
        return profile_key(self.spec, image=self.image)

    def body(self, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The owner object the manifest builders take (``spec`` defaults to this one's)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid or ""},
            "spec": copy.deepcopy(dict(spec if spec is not None else self.spec)),
        }

    def stored_spec(self) -> dict[str, Any]:
        """The spec as kept in ``status.servingSpec`` (last good), image resolved."""
        return copy.deepcopy(dict(self.spec))


def parse(obj: Mapping[str, Any], *, default_image: str) -> ModelSpec:
    """Validate and default ``obj``'s spec; ``InvalidSpec`` for any problem, never another error."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    raw = obj.get("spec")
    try:
        errors = validate_spec(raw, name=name)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        errors = [f"spec could not be read: {type(exc).__name__}: {exc}"[:500]]
    annotations = dict(meta.get("annotations") or {})
    serving = annotations.get(SERVING_CPUS_ANNOTATION)
    if serving is not None and not errors:
        cpus = int(raw["cpus"]) if isinstance(raw, Mapping) else 0
        if not (
            isinstance(serving, str)
            and serving.isascii()
            and serving.isdigit()
            and 1 <= int(serving) <= cpus
        ):
            errors.append(
                f"annotation {SERVING_CPUS_ANNOTATION} must be an integer in 1..spec.cpus "
                f"({cpus}), got {serving!r}"
            )
    if errors:
        raise InvalidSpec(errors)
    assert isinstance(raw, Mapping)
    spec = with_defaults(raw)
    image = str(spec.get("image") or default_image)
    spec["image"] = image
    generation = meta.get("generation")
    return ModelSpec(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        uid=meta.get("uid"),
        generation=int(generation) if isinstance(generation, int) else None,
        spec=spec,
        image=image,
        annotations=annotations,
    )
