"""The pool process runs each model's requests with its plan's threads (the operator puts
them in the model's config entry), bounded by the pod's cores, and ``/pool/status`` reports
them; a new config changes a served model's threads without rebuilding it. Real pool (tiny
PyTorch models)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from packrat.serve.pool.host import ConfigError, Cores, Pool, load_config


def _config(tmp: Path, *, a_threads: int | None, cores: int = 2) -> dict[str, Any]:
    a: dict[str, Any] = {"name": "a", "spec": "tiny", "seed": 1}
    if a_threads is not None:
        a.update(threads=a_threads, batch=1)
    b = {"name": "b", "spec": "tiny", "seed": 2}
    return {"directory": str(tmp), "budget_bytes": 1 << 24, "threads": cores, "models": [a, b]}


def test_threads_and_batch_are_checked() -> None:
    for bad in (0, -1, True, 1.5, "2", 10_000):
        doc: dict[str, Any] = {
            "directory": "/x",
            "budget_bytes": 1,
            "models": [{"name": "a", "spec": "tiny"}],
        }
        doc["models"][0]["threads"] = bad
        with pytest.raises(ConfigError, match="threads"):
            load_config(doc)
    entry = load_config(
        {"directory": "/x", "budget_bytes": 1, "models": [{"name": "a", "spec": "tiny"}]}
    ).models[0]
    assert (entry.threads, entry.batch) == (1, None)  # no plan yet: one thread, as before


def test_each_model_runs_with_its_plans_threads(tmp_path: Path, monkeypatch: Any) -> None:
    pool = Pool(load_config(_config(tmp_path, a_threads=2)))
    seen: dict[str, int] = {}
    real = pool.models["a"].lm.__class__.__call__

    def spy(self: Any, x: Any, mode: Any) -> Any:
        name = next(n for n, m in pool.models.items() if m.lm is self)
        seen[name] = torch.get_num_threads()
        return real(self, x, mode)

    monkeypatch.setattr(pool.models["a"].lm.__class__, "__call__", spy)
    body = b"[" + b",".join([b"0.5"] * 16) + b"]"
    for name in ("a", "b"):
        worker = threading.Thread(target=pool.infer, args=(name, [body]))
        worker.start()  # a compute thread of its own, as the server's executor
        worker.join()
    assert seen == {"a": 2, "b": 1}
    status = pool.status()["models"]
    assert (status["a"]["threads"], status["a"]["batch"]) == (2, 1)
    assert (status["b"]["threads"], status["b"]["batch"]) == (1, None)
    # a new plan: the same model (not rebuilt), its new threads from the next request on
    model_a = pool.models["a"]
    added, removed = pool.reconfigure(load_config(_config(tmp_path, a_threads=1)))
    assert added == [] and removed == [] and pool.models["a"] is model_a
    assert pool.status()["models"]["a"]["threads"] == 1


def test_cores_never_hand_out_more_threads_than_the_pod_has() -> None:
    cores = Cores(2)
    busy, peak, lock = [0], [0], threading.Lock()

    def run(wanted: int) -> None:
        with cores.take(wanted) as n:
            with lock:
                busy[0] += n
                peak[0] = max(peak[0], busy[0])
            time.sleep(0.01)
            with lock:
                busy[0] -= n

    workers = [threading.Thread(target=run, args=(w,)) for w in (2, 1, 1, 8, 1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert peak[0] <= 2 and cores.free == 2
