"""``spec.requestLogging``: request and response logging at the serving pods, checked and
turned into ``packrat serve`` flags (:mod:`packrat.serve.dispatcher.payload_log` does the
logging). Off when the field is absent."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.controller.core.options.fields import known_object
from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogError

FIELD = "requestLogging"
_FIELDS = {"sink", "sampleRate", "mode", "queueSize", "maxBodyBytes"}
_SINK = re.compile(r"^(stdout|https?://\S+)$")


def validate_request_logging(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append a message for every problem with ``spec.requestLogging`` (as the CRD checks)."""
    where = f"spec.{FIELD}"
    logging = known_object(errors, spec.get(FIELD), where=where, fields=_FIELDS)
    if logging is None:
        return
    sink = logging.get("sink")
    if not isinstance(sink, str) or len(sink) > 2048 or not _SINK.fullmatch(sink):
        errors.append(f"{where}.sink must be stdout or an http(s):// URL, got {sink!r}")
    elif sink != "stdout":
        try:  # the pods' own check: a plain host[:port], not an internal address
            PayloadLogConfig(sink=sink)
        except PayloadLogError as exc:
            errors.append(f"{where}.sink: {exc}")
    rate = logging.get("sampleRate", 1)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
        errors.append(f"{where}.sampleRate must be in (0, 1], got {rate!r}")
    if logging.get("mode", "binary") not in ("binary", "structured"):
        errors.append(f"{where}.mode must be binary or structured")
    for key, low, high in (("queueSize", 1, 100_000), ("maxBodyBytes", 0, 1_048_576)):
        value = logging.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
        ):
            errors.append(f"{where}.{key} must be an integer in {low}..{high}, got {value!r}")


@dataclass(frozen=True, slots=True)
class RequestLogging:
    """``spec.requestLogging``, defaulted."""

    sink: str
    sample_rate: float
    mode: str
    queue_size: int
    max_body_bytes: int


def request_logging(spec: Mapping[str, Any]) -> RequestLogging | None:
    """The valid ``spec.requestLogging``, typed (None when it is absent)."""
    logging = spec.get(FIELD)
    if not isinstance(logging, Mapping) or not logging.get("sink"):
        return None
    return RequestLogging(
        sink=str(logging["sink"]),
        sample_rate=float(logging.get("sampleRate", 1)),
        mode=str(logging.get("mode", "binary")),
        queue_size=int(logging.get("queueSize", 1000)),
        max_body_bytes=int(logging.get("maxBodyBytes", 65536)),
    )


def request_log_args(logging: RequestLogging | None, *, namespace: str, name: str) -> list[str]:
    """The ``packrat serve`` flags for ``spec.requestLogging`` (none when it is absent)."""
    if logging is None:
        return []
    rate = logging.sample_rate
    return [
        "--request-log",
        "jsonl:-" if logging.sink == "stdout" else logging.sink,
        "--request-log-sample-rate",
        f"{rate:g}" if math.isfinite(rate) else "1",
        "--request-log-mode",
        logging.mode,
        "--request-log-queue",
        str(logging.queue_size),
        "--request-log-max-body-bytes",
        str(logging.max_body_bytes),
        "--request-log-source",
        f"/packrat/namespaces/{namespace}/packratmodels/{name}",
    ]
