"""``spec.autoscaling`` in a pass: how many replicas serve, and the tuner's decisions.

The decision rules are the pure :class:`packrat.plan.envelope.Tuner` (InferLine's tuner:
scale up at once when a window's arrival rate exceeds what the replicas sustain, down only
after ``scaleDownDelaySeconds`` without the need). This module keeps one tuner per model
(built from its :class:`~packrat.controller.core.slo_spec.TunerReference`: the provisioned plan's
replicas, capacity per replica and sample envelope with ``spec.slo``, or the reference in
``spec.autoscaling.reference``, which a pipeline gives its stage models), feeds it the
arrivals the pods saw since the last pass, and writes each decision with its reason to
``status.autoscaling`` and, when the count changes, an Event. The count
is kept in status, so a restarted operator serves the same number; its new tuner has no
history, and so cannot scale down before it has watched for the whole delay.

With ``mode: external`` (an HPA or KEDA through the scale subresource) the replica count is
``spec.replicas``: the operator reads it and never writes it.

Start-up time (issue 27): each pass measures how long the model's pods took to become ready
(:mod:`packrat.controller.planning.startup`, at least ``startupFloorSeconds``) and gives the
tuner that time plus one decision interval, with the growth the plan's sample shows within
it, so it keeps headroom for the load a new replica would meet too late
(``status.autoscaling.startup`` says what it planned with).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from packrat.controller.core.context import ModelPass as Pass
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.slo_spec import TunerReference
from packrat.controller.core.status import ModelStatus, now_iso
from packrat.controller.planning import startup as su
from packrat.controller.serving import manifests as m
from packrat.plan.envelope import Tuner, growth_at

NOISE_Z = 3.0
"""A window the plan expects k arrivals in may see 3 sqrt(k) more before they count as load
(measured on the emulator: at a steady 2/s a 100 ms window read 4 arrivals against the
sample's 3, and that one arrival scaled the model up)."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Arrival timestamps (seconds since the epoch, sorted) the ready pods saw since the last
    reading, merged; ``pods`` is how many answered."""

    times: Sequence[float]
    pods: int


def mode(model: ModelSpec) -> str | None:
    auto = model.autoscaling
    return auto.mode if auto is not None else None


def tuned(model: ModelSpec) -> bool:
    """Whether the replica count is the operator's (an SLO, or a tuner reference)."""
    return model.slo is not None or model.reference is not None


def _clamp(model: ModelSpec, n: int) -> int:
    auto = model.autoscaling
    if auto is None:
        return max(1, min(100, n))
    return max(auto.min_replicas, min(auto.max_replicas, n))


def serving_replicas(
    model: ModelSpec, status: ModelStatus, ref: TunerReference | None = None
) -> int:
    """The replica count the active slot should run now.

    No SLO and no tuner reference, or ``mode: external``: ``spec.replicas``. Otherwise: the
    tuner's count when it scaled this reference, else the planned count (clamped to min/max
    replicas). ``ref``: this pass's provisioning; without it, the spec's own reference, else
    the last provisioning in status."""
    if not tuned(model) or mode(model) == "external":
        return model.replicas
    ref = ref or model.reference
    provisioning = status.provisioning
    planned = ref.replicas if ref is not None else provisioning.replicas
    signature = ref.signature if ref is not None else provisioning.signature
    if planned is None:
        return model.replicas  # before the first provisioning
    current = status.autoscaling.serves(signature)
    if mode(model) == "envelope" and current is not None:
        return _clamp(model, current)
    return _clamp(model, planned)


class Tuners:
    """One :class:`Tuner` per model and provisioning (rebuilt when the plan changes)."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, Tuner]] = {}
        self._lock = threading.Lock()

    def get(self, model: ModelSpec, ref: TunerReference, current: int) -> Tuner:
        key = f"{model.namespace}/{model.name}"
        auto = model.autoscaling
        assert auto is not None
        signature = f"{ref.signature}:{auto.signature}"
        with self._lock:
            found = self._items.get(key)
            if found is not None and found[0] == signature:
                return found[1]
            low, high = auto.min_replicas, auto.max_replicas
            tuner = Tuner(
                planned_replicas=ref.replicas,
                replica_capacity=ref.capacity,
                windows=ref.windows,
                planned_rates=ref.planned_rates,
                min_replicas=low,
                max_replicas=high,
                scale_down_delay_s=auto.scale_down_delay_seconds,
                noise_z=NOISE_Z,
            )
            tuner.replicas = max(low, min(high, current))
            self._items[key] = (signature, tuner)
            return tuner

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._items.pop(f"{namespace}/{name}", None)


def tune(
    p: Pass,
    model: ModelSpec,
    ref: TunerReference,
    *,
    arrivals: Arrivals | None,
    tuners: Tuners,
    current: int,
    capacity: float | None = None,
) -> int:
    """Feed the new arrivals to the model's tuner and decide; returns the replica count.

    Without a reading (no pod answered) nothing is decided: missing data must not look like
    missing load. ``capacity``: what one replica of the running plan serves, when autoBatch
    moved it away from the planned one: the tuner's thresholds scale with it when it serves
    less, never when it serves more (a larger batch absorbs a surge while replicas start; it
    does not replace them: ``benchmarks/tuner/joint_step.py``)."""
    status = p.status
    tuner = tuners.get(model, ref, current)
    tuner.set_capacity(min(capacity, ref.capacity) if capacity is not None else ref.capacity)
    ready_in = startup_headroom(p, model, ref, tuner)
    scaled = status.autoscaling.for_reference(ref.signature)
    scaled = scaled.tuning(
        planned={
            "replicas": ref.replicas,
            "capacityPerReplica": round(ref.capacity, 3),
            "windowsSeconds": [round(w, 4) for w in ref.windows],
            "ratesPerSecond": [round(r, 3) for r in tuner.sustained],
        },
        startup={**ready_in.to_status(), "growth": round(tuner.growth, 4)},
    )
    if arrivals is None:
        status.set_autoscaling(scaled.holding(tuner.replicas))
        return tuner.replicas
    tuner.observe(arrivals.times)
    decision = tuner.decide(p.now.timestamp())
    envelope = {
        "ratesPerSecond": [round(r, 3) for r in decision.rates],
        "pods": arrivals.pods,
        "time": now_iso(p.now),
    }
    decided = {
        "time": now_iso(p.now),
        "action": decision.action,
        "replicas": decision.replicas,
        "previous": decision.previous,
        "wantedNow": decision.wanted_now,
        "reason": decision.reason,
    }
    status.set_autoscaling(scaled.decided(envelope=envelope, decision=decided))
    p.result.autoscale = {
        "action": decision.action,
        "replicas": decision.replicas,
        "rates": dict(zip(ref.windows, decision.rates, strict=True)),
        "capacity": decision.replicas * ref.capacity,
    }
    if decision.action == "scale_up":
        p.emit("Normal", "ScaledUp", decision.reason)
    elif decision.action == "scale_down":
        p.emit("Normal", "ScaledDown", decision.reason)
    return decision.replicas


def startup_headroom(p: Pass, model: ModelSpec, ref: TunerReference, tuner: Tuner) -> su.Startup:
    """Measure the model's start-up from its pods and give the tuner that time plus one
    decision interval (a replica asked for at the next decision serves that much later)
    with the growth the plan's sample shows within it."""
    auto = model.autoscaling
    assert auto is not None
    pods = p.kube.list("pods", p.namespace, labels=m.base_labels(p.name))
    ready_in = su.measure(pods, floor_s=auto.startup_floor_seconds)
    horizon = ready_in.seconds + auto.interval_seconds
    growth = growth_at(ref.growth, horizon) if ready_in.seconds > 0 else 1.0
    tuner.set_startup(ready_in.seconds, growth)
    return ready_in


def publish_scale(p: Pass, replicas: int) -> None:
    """``status.replicas`` and ``status.selector``, what the scale subresource reports to an
    HPA or KEDA (the active slot's pods)."""
    selector = m.service_selector(p.name, slot=str(p.status["activeSlot"]))
    p.status.set_scale(replicas, ",".join(f"{k}={v}" for k, v in sorted(selector.items())))
