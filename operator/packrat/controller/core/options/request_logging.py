"""``spec.requestLogging``: request and response logging at the serving pods, checked and
turned into ``packrat serve`` flags (:mod:`packrat.serve.dispatcher.payload_log` does the
logging). Off when the field is absent."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogError

FIELD = "requestLogging"


def validate_request_logging(errors: list[str], spec: Mapping[str, Any]) -> None:
    """Append a message when ``spec.requestLogging.sink`` is a URL the pods refuse (a plain
    host[:port], not an internal address); the CRD's schema checks the rest."""
    logging = spec.get(FIELD)
    sink = logging.get("sink") if isinstance(logging, Mapping) else None
    if not isinstance(sink, str) or not sink.startswith(("http://", "https://")):
        return  # stdout, or not a URL at all (the schema's pattern reports it)
    try:  # the pods' own check
        PayloadLogConfig(sink=sink)
    except PayloadLogError as exc:
        errors.append(f"spec.{FIELD}.sink: {exc}")


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
