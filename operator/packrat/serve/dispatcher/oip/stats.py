"""Counters per model for the Open Inference Protocol's statistics extension
(``GET /v2/models/{name}/stats``): every answer the dispatcher counts (REST, gRPC and
``/predictions`` alike), successes and failures with their total time, and when the last
success was. Two additions per answer on the event loop, nothing else."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ModelStats"]


class ModelStats:
    def __init__(self) -> None:
        self.success = [0, 0]  # count, nanoseconds
        self.fail = [0, 0]
        self.last_ms = 0  # the last success, milliseconds since the epoch

    def record(self, ok: bool, seconds: float) -> None:
        entry = self.success if ok else self.fail
        entry[0] += 1
        entry[1] += int(seconds * 1e9)
        if ok:
            self.last_ms = int(time.time() * 1000)

    def document(self, model: str, version: str) -> dict[str, Any]:
        """Triton's statistics extension answer (what tritonclient's
        ``get_inference_statistics`` reads); the stages Packrat does not time are zeros."""
        zero = {"count": 0, "ns": 0}
        count, ns = self.success
        return {
            "model_stats": [
                {
                    "name": model,
                    "version": version,
                    "last_inference": self.last_ms,
                    "inference_count": count,
                    "execution_count": count,
                    "inference_stats": {
                        "success": {"count": count, "ns": ns},
                        "fail": {"count": self.fail[0], "ns": self.fail[1]},
                        "queue": zero,
                        "compute_input": zero,
                        "compute_infer": zero,
                        "compute_output": zero,
                    },
                    "batch_stats": [],
                }
            ]
        }
