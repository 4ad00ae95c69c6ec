"""When a model's next pass runs: the one place that answers it.

A model's daemon (:mod:`packrat.controller.handlers`) runs a pass, then waits for a watch event
or for the delay decided here, whichever comes first. The rules:

- **Before a pass** (:func:`before_pass`, from the spec and the status stored before it): an
  autoBatch model at rest (Ready, no switch) reads its pods' batch-size estimates; a model
  with the envelope tuner (``spec.autoscaling``, something to tune from, no switch) reads the
  arrivals its pods (or its ``ingress`` Service's) saw. Both are read before the pass, never
  during it (:func:`read_before_pass`).
- **After a pass** (:func:`next_pass`): the resync (``resync_seconds``) at rest, the poll
  interval while something is in progress (``Again.waiting``), and never later than what must
  be sampled: an autoBatch model's estimates (``estimate_seconds``), the tuner's interval, a
  storageUri model's store (``storage_check_seconds``), and whatever a step of the pass asked
  for (``Again.within``: a backoff, an estimate due, a token to rotate).
- **Between passes** (:func:`peek_until`): with autoBatch's fast trigger, the pods the pass
  read are read again every ``sustainSeconds`` (no API call) until the pass is due or a read
  calls for one.

A PackratPipeline's passes follow :func:`pipeline_delay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.context import Again
from packrat.controller.core.model import ModelSpec
from packrat.controller.core.status import ModelStatus
from packrat.controller.core.storage import needs_version_check
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning.arrivals import ArrivalReader
from packrat.controller.planning.autoscale import Arrivals
from packrat.controller.planning.estimates import EstimateReader
from packrat.controller.serving.admin_token import read_token
from packrat.plan.reconfig import FastPolicy

logger = logging.getLogger(__name__)

FAST_MIN_INTERVAL = 0.5
"""The shortest interval between two reads of a model's estimates (the fast trigger)."""


@dataclass(frozen=True)
class Cadence:
    """The operator's intervals (``packrat operator`` flags)."""

    # a model at rest is re-read this often (safety net; changes arrive as watch events)
    resync_seconds: float = 300.0
    # while something is in progress (profiling, a switch, pods starting)
    poll_seconds: float = 2.0
    # an autoBatch model at rest reads its pods' batch-size estimates this often: each pass
    # is one observation of autoBatch.sustainObservations (nothing else would wake it)
    estimate_seconds: float = 5.0
    # a storageUri model without a digest asks its store for a new version this often
    storage_check_seconds: float = 300.0


@dataclass(frozen=True)
class Before:
    """What a model's pass reads before it runs, and what its schedule follows from its spec."""

    estimates: bool = False  # read the pods' batch-size estimates
    tuning: float | None = None  # the tuner's interval: read the arrivals
    ingress: tuple[str, float] | None = None  # the arrivals' Service and scale factor
    auto: bool = False  # spec.autoBatch: sampled every estimate interval
    checks_store: bool = False  # a storageUri model without a digest
    fast_every: float | None = None  # the fast trigger's read interval, when on
    fast: FastPolicy | None = None

    @property
    def arrivals(self) -> bool:
        return self.tuning is not None


@dataclass(frozen=True)
class NextPass:
    """The wait after a pass: ``delay`` seconds, the pods read every ``peek_every`` seconds
    meanwhile (None: not at all)."""

    delay: float
    peek_every: float | None = None


def before_pass(model: ModelSpec | None, stored: Mapping[str, Any]) -> Before:
    """The reads before a pass of ``model`` (None: invalid, nothing read), from the status
    ``stored`` before it."""
    if model is None:
        return Before()
    status = ModelStatus(stored)
    switching = status.switch is not None  # under way or given up: neither read
    auto = model.auto
    return Before(
        estimates=auto is not None and status.get("phase") == "Ready" and not switching,
        tuning=None if switching else tuner_interval(model),
        ingress=ingress_of(model),
        auto=auto is not None,
        checks_store=needs_version_check(model.source.doc),
        fast_every=fast_estimate_interval(model),
        fast=ab.fast_policy_from_spec(auto) if auto is not None else None,
    )


def tuner_interval(model: ModelSpec | None) -> float | None:
    """Seconds between the tuner's looks when ``spec.autoscaling.mode`` is envelope and there
    is something to tune from (``spec.slo`` or ``autoscaling.reference``); else None."""
    auto = model.autoscaling if model is not None else None
    if model is None or auto is None:
        return None
    if model.slo is None and not auto.has_reference:
        return None  # nothing to tune from
    return auto.interval_seconds if auto.mode == "envelope" else None


def ingress_of(model: ModelSpec | None) -> tuple[str, float] | None:
    """``spec.autoscaling.ingress`` as (Service, scale factor), when set (validated)."""
    auto = model.autoscaling if model is not None else None
    return auto.ingress if auto is not None else None


def fast_estimate_interval(model: ModelSpec | None) -> float | None:
    """How often the fast trigger reads the pods (``autoBatch.sustainSeconds``, at least
    ``FAST_MIN_INTERVAL``): the estimate held that long is seen within one more interval."""
    auto = model.auto if model is not None else None
    if auto is None or auto.sustain_seconds <= 0:
        return None
    return max(FAST_MIN_INTERVAL, auto.sustain_seconds)


def next_delay(
    cadence: Cadence,
    again: Again,
    *,
    wants_estimates: bool = False,
    tuning: float | None = None,
    checks_store: bool = False,
) -> float:
    """Seconds until a model's next pass when no watch event comes first: the poll interval
    while ``again.waiting``, else the resync; never later than what must be sampled (the
    estimates, the tuner's interval, the store) nor than ``again.within``."""
    delay = cadence.poll_seconds if again.waiting else cadence.resync_seconds
    if wants_estimates:
        delay = min(delay, cadence.estimate_seconds)
    if tuning is not None:
        delay = min(delay, tuning)
    if checks_store:
        delay = min(delay, cadence.storage_check_seconds)
    if again.within is not None:
        delay = min(delay, again.within)
    return delay


def peek_interval(
    every: float | None, reading: ab.Reading | None, *, waiting: bool
) -> float | None:
    """How often to read a model's pods between its passes; None when not at all: no fast
    trigger (``every`` None), something in progress (the passes run often then), or estimates
    read through the Service (no pods listed to read again)."""
    if every is None or waiting or reading is None or reading.source != "pods":
        return None
    return every


def next_pass(
    cadence: Cadence, before: Before, again: Again, reading: ab.Reading | None
) -> NextPass:
    """The wait after a pass that read what ``before`` said (``reading``: the estimates it
    read) and asked ``again``."""
    delay = next_delay(
        cadence,
        again,
        wants_estimates=before.auto,
        tuning=before.tuning,
        checks_store=before.checks_store,
    )
    every = peek_interval(before.fast_every, reading, waiting=again.waiting or not before.estimates)
    if every is None or delay <= every or not before.auto:
        return NextPass(delay)
    return NextPass(delay, peek_every=every)


def pipeline_delay(cadence: Cadence, again: Again, *, serving: bool, measure: float) -> float:
    """Seconds until a PackratPipeline's next pass: the poll interval while something is in
    progress, else the resync; a serving pipeline's routers are measured every ``measure``."""
    delay = cadence.poll_seconds if again.waiting else cadence.resync_seconds
    return min(delay, measure) if serving else delay


async def peek_until(
    delay: float,
    *,
    every: float,
    basis: ab.Reading,
    fast: FastPolicy,
    wakeup: asyncio.Event,
    peek: Callable[[], Awaitable[ab.Reading | None]],
) -> float:
    """Between two passes of an autoBatch model with the fast trigger: read the pods the
    last pass read every ``every`` seconds (no API call) until ``delay`` is over, a watch
    event wakes the model, or a read calls for a pass (:func:`ab.peek_wake`); then the
    seconds still to wait before the next pass (0: at once).

    The fast trigger's reads cost the API server nothing: while the pods' estimates hold,
    passes run only at the operator's estimate interval. A wake for batch timeouts comes at
    most once per ``fast.min_interval_s`` (a pass decides whether they still matter)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + delay
    while (left := end - loop.time()) > every:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout=every)
            return 0.0  # a watch event: the pass runs now
        wake = ab.peek_wake(basis, await peek(), fast)
        if wake is None or (wake[0] == "timeouts" and delay - left < fast.min_interval_s):
            continue
        logger.debug("a look at the pods calls for a pass: %s", wake[1])
        return 0.0
    return max(0.0, end - loop.time())


def read_before_pass(
    estimates: EstimateReader,
    arrivals: ArrivalReader,
    namespace: str,
    name: str,
    *,
    want_estimates: bool,
    want_arrivals: bool,
    ingress: tuple[str, float] | None = None,
) -> tuple[ab.Reading | None, Arrivals | None]:
    """The pods' batch-size estimates and the arrivals they saw, read before a pass (never
    during it). A model that wants both reads its Service and lists its ready pods once,
    for the two readers. ``ingress`` (``spec.autoscaling.ingress``: a Service and a scale
    factor): the arrivals are that Service's pods' (a pipeline's router), thinned to the
    scale factor, in place of the model's own."""
    shared = want_estimates and want_arrivals and ingress is None
    pods = estimates.ready_pods(namespace, name) if shared else None
    # one read of the model's token for both readers (its pods show their counts with it)
    token = (read_token(estimates.kube, namespace, name),) if shared and pods else None
    reading = (
        ab.as_reading(estimates(namespace, name, pods, token=token)) if want_estimates else None
    )
    if not want_arrivals:
        return reading, None
    if ingress is None:
        return reading, arrivals(namespace, name, pods, token=token)
    service, factor = ingress
    return reading, arrivals.ingress(namespace, service, reader=name, factor=factor)
