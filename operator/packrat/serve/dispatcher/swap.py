"""The dispatcher's in-pod swap bookkeeping: the current instance set and the old sets that
still finish their requests after :meth:`SwapMixin.swap`.

An in-pod plan switch (:mod:`packrat.serve.pod.inpod`) hands the dispatcher a new, warmed set of
instances: from that instant every new request goes to the new set, while requests already
queued or in flight on the old set finish there (each request keeps the slots it was admitted
to); the caller then waits for the old set to be idle (:meth:`SwapMixin.retire`) before
unregistering it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from packrat.serve.config import InstanceSpec
from packrat.serve.dispatcher.metrics import ServeMetrics
from packrat.serve.dispatcher.slots import BackendGoneError, Slots

__all__ = ["SwapMixin"]

log = logging.getLogger(__name__)


class _Host(Protocol):
    """What the swap needs of the dispatcher it is mixed into."""

    model: str
    instances: list[InstanceSpec]
    slots: Slots
    metrics: ServeMetrics
    _retiring: list[Slots]

    def _gauges(self) -> None: ...
    def _label_instances(self) -> None: ...
    def set_up(self, index: int, up: bool) -> None: ...


class SwapMixin:
    """:meth:`swap` to a new instance set and :meth:`retire` the old one, for the dispatcher."""

    def swap(self: _Host, instances: Sequence[InstanceSpec]) -> Slots:
        """Send every new request to ``instances`` (warmed, all up) from now on; returns the
        old set's slots, whose queued and in-flight requests still finish on the old set."""
        if self.slots.failed:
            raise BackendGoneError(self.slots.failed)
        old, old_instances = self.slots, self.instances
        self.instances = list(instances)
        self.slots = Slots(
            [inst.batch for inst in self.instances],
            queue_limit=old.queue_limit,
            queue_timeout_s=old.queue_timeout_s,
            on_change=self._gauges,
            stuck_after_s=old.stuck_after_s,
        )
        self._retiring.append(old)
        self._label_instances()
        for i in range(len(self.instances)):
            self.set_up(i, True)
        log.info(
            "dispatcher: %s -> %s",
            ",".join(i.name for i in old_instances),
            ",".join(i.name for i in self.instances),
        )
        return old

    async def retire(
        self: _Host, old: Slots, instances: Sequence[InstanceSpec], *, timeout_s: float
    ) -> bool:
        """Wait until the old set ``old`` (returned by :meth:`swap`) is idle, then forget it;
        False when requests were still outstanding after ``timeout_s``."""
        idle = await old.wait_idle(timeout_s)
        with contextlib.suppress(ValueError):
            self._retiring.remove(old)
        for inst in instances:
            self.metrics.instance_up.labels(self.model, inst.name).set(0)
        self._gauges()
        return idle
