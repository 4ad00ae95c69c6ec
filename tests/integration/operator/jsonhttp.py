"""The integration tests' one JSON request helper (urllib: no dependency beyond the standard
library), for the serving pods, the pools and the operator harness's predictions alike; here,
beside the harness, so the benchmarks that import the harness find it too."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http_json(
    url: str,
    doc: Any = None,
    *,
    body: bytes | None = None,
    token: str | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """GET ``url``, or POST ``doc`` as JSON (``body``: bytes sent as they are, malformed ones
    included), with ``token`` as the bearer token when given: (status, the answer as JSON,
    an error's too, or its text when it is not JSON; 0 and the reason when nothing
    answered)."""
    data = body if body is not None or doc is None else json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        url, data=data, method="GET" if data is None else "POST", headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:  # refused, reset, timed out: nothing answered
        return 0, str(exc)
    try:
        return status, json.loads(raw)
    except ValueError:  # not JSON (or not UTF-8): the text, for the test's message
        return status, raw.decode(errors="replace")
