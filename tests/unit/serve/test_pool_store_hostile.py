"""The pool process against a corrupted store and a hand-edited config (real pool, tiny
PyTorch models, real layer files).

- A model's layer file is the pod's cache of its zoo weights: one that is truncated, lies in
  its header or holds another spec is written anew from the spec, and the model answers as
  from a fresh file; the other models never notice. Before, one such file failed the pool's
  start (every model down) or, for a model whose spec changed under its name, every
  reconfiguration that named it, forever.
- A configuration that cannot be applied applies nothing: the pool keeps the last good
  one's models, budget, mode and threads, and ``/pool/status`` keeps reporting the last good
  file's digest. Before, the new config's digest, budget and mode were taken before its
  models were built, so a pod that failed to add a model reported the new digest, and the
  operator moved that model's Service to a pod that 404s it.
- A layer file truncated under the running pool (SIGBUS on the next touch: the whole pool
  died) is a 503 for that model while its file is written anew.
- ``/pool/status`` (and ``/metrics``) read the models once, and a request for a model
  dropped while it waited is a 404 (before: KeyErrors, 500s).
- A request that timed out keeps its queue place until its job ends (before, 504s queued
  jobs without bound).
- A config file larger than 1 MiB, nested too deeply or holding an infinite number is one
  ConfigError line (before: read whole; RecursionError, OverflowError)."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from packrat.runtime import layerfile
from packrat.serve import codec
from packrat.serve.pool.app import _Runner
from packrat.serve.pool.host import (
    CONFIG_MAX_BYTES,
    ConfigError,
    ModelGoneError,
    Pool,
    read_config,
)

BODY = codec.example_body("tiny")


def _config(tmp: Path, models: list[dict[str, Any]], **extra: Any) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "pool.json"
    doc = {"directory": "files", "budget_bytes": 1 << 24, "models": models, **extra}
    path.write_text(json.dumps(doc))
    return path


def _answer(pool: Pool, name: str) -> str:
    return pool.infer(name, [BODY])[0]


def _fresh_answer(tmp: Path, seed: int) -> str:
    pool = Pool(read_config(_config(tmp, [{"name": "x", "spec": "tiny", "seed": seed}])))
    return _answer(pool, "x")


def _header(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[8:16])
    doc: dict[str, Any] = json.loads(raw[16 : 16 + length])
    return doc


def _with_header(path: Path, doc: dict[str, Any]) -> None:
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[8:16])
    header = json.dumps(doc).encode()
    raw[: 16 + length] = bytes(16 + length)
    raw[: 16 + len(header)] = layerfile.MAGIC + struct.pack("<Q", len(header)) + header
    path.write_bytes(bytes(raw))


def _lying(path: Path) -> None:
    doc = _header(path)
    doc["layers"][0]["offset"] = -4096  # eviction would madvise memory below the mapping
    _with_header(path, doc)


def _other_spec(path: Path) -> None:
    doc = _header(path)
    doc["spec"] = "resnet50"  # the model's spec before it changed under its name
    _with_header(path, doc)


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: 3 * layerfile.PAGE])


@pytest.mark.parametrize("spoil", [_lying, _other_spec, _truncated])
def test_a_spoiled_layer_file_is_written_anew_and_the_pool_starts(
    tmp_path: Path, spoil: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    want = {"a": _fresh_answer(tmp_path / "ref-a", 1), "b": _fresh_answer(tmp_path / "ref-b", 2)}
    models = [{"name": "a", "spec": "tiny", "seed": 1}, {"name": "b", "spec": "tiny", "seed": 2}]
    path = _config(tmp_path, models)
    Pool(read_config(path))  # writes both files
    spoil(tmp_path / "files" / "b.layers")
    pool = Pool(read_config(path))
    assert {n: _answer(pool, n) for n in ("a", "b")} == want
    assert "b.layers" in capsys.readouterr().out  # said what it rewrote, in one line


def test_a_spoiled_file_of_a_model_added_later_is_written_anew(tmp_path: Path) -> None:
    want = _fresh_answer(tmp_path / "ref", 2)
    models = [{"name": "a", "spec": "tiny", "seed": 1}]
    pool = Pool(read_config(_config(tmp_path, models)))
    (tmp_path / "files" / "b.layers").write_bytes(layerfile.MAGIC + b"\xff" * 64)
    models.append({"name": "b", "spec": "tiny", "seed": 2})
    assert pool.reconfigure(read_config(_config(tmp_path, models))) == (["b"], [])
    assert _answer(pool, "b") == want


def test_a_config_that_cannot_be_applied_applies_nothing(tmp_path: Path) -> None:
    models = [{"name": "a", "spec": "tiny", "seed": 1}]
    first = read_config(_config(tmp_path, models, mode="demand", threads=1))
    pool = Pool(first)
    before = _answer(pool, "a")
    (tmp_path / "files" / "b.layers").mkdir()  # b's file can be neither read nor written
    models.append({"name": "b", "spec": "tiny", "seed": 2})
    models[0]["threads"] = 2
    bad = read_config(_config(tmp_path, models, mode="load", threads=2, budget_bytes=1 << 20))
    assert bad.digest != first.digest
    with pytest.raises(OSError):
        pool.reconfigure(bad)
    status = pool.status()
    assert status["config_digest"] == first.digest  # the operator moves nothing here
    assert (status["mode"], status["budget_bytes"]) == ("demand", 1 << 24)
    assert list(status["models"]) == ["a"] and status["models"]["a"]["threads"] == 1
    assert pool.cores.total == 1
    assert _answer(pool, "a") == before
    (tmp_path / "files" / "b.layers").rmdir()  # the store recovers: the same config applies
    assert pool.reconfigure(bad) == (["b"], [])
    assert pool.status()["config_digest"] == bad.digest and pool.config.mode == "load"


def test_a_model_whose_spec_changed_is_dropped_with_its_pages(tmp_path: Path) -> None:
    """The old model under the same name leaves as a dropped one does: its pages evicted."""
    path = _config(tmp_path, [{"name": "a", "spec": "tiny", "seed": 1}])
    pool = Pool(read_config(path))
    _answer(pool, "a")
    old = pool.models["a"]
    assert sum(old.lm.lf.resident_layers()) > 0
    old.spec = "resnet50"  # what it served before its spec changed to the config's
    assert pool.reconfigure(read_config(path)) == (["a"], [])
    assert pool.models["a"] is not old
    assert sum(old.lm.lf.resident_layers()) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (" " * CONFIG_MAX_BYTES + "{}", "larger than"),
        ("[" * 100_000, "RecursionError"),
        ('{"directory": "d", "budget_bytes": Infinity, "models": [{"name": "a", "spec": "tiny"}]}',
         "malformed"),
    ],
)  # fmt: skip
def test_a_hostile_config_file_is_one_config_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pool.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        read_config(path)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_the_pool_threads_are_bounded(tmp_path: Path) -> None:
    config = read_config(_config(tmp_path, [{"name": "a", "spec": "tiny"}], threads=10**12))
    assert config.threads == 256


def test_status_reads_the_models_once_while_a_reconfigure_swaps_them(tmp_path: Path) -> None:
    """``/metrics`` and ``/pool/status`` render while the config watcher adds a model: before,
    a model added between status()'s readings was a KeyError (a 500)."""
    models = [{"name": "a", "spec": "tiny", "seed": 1}]
    pool = Pool(read_config(_config(tmp_path, models)))
    more = read_config(_config(tmp_path, [*models, {"name": "b", "spec": "tiny", "seed": 2}]))
    sample = pool.sample_memory

    def reconfigured_meanwhile() -> tuple[int, int]:
        if "b" not in pool.models:
            pool.reconfigure(more)
        return sample()

    pool.sample_memory = reconfigured_meanwhile  # type: ignore[method-assign]
    assert list(pool.status()["models"]) == ["a"]  # the models of the one reading
    assert list(pool.status()["models"]) == ["a", "b"]


def test_a_request_for_a_model_dropped_meanwhile_is_a_404(tmp_path: Path) -> None:
    """Routed while the model was there, run after a reconfigure dropped it (before: a
    KeyError in the compute thread, a 500)."""
    pool = Pool(read_config(_config(tmp_path, [{"name": "a", "spec": "tiny"}])))
    runner = _Runner(pool, max_queue=4, timeout_s=30, max_samples=4)
    got = asyncio.run(runner.run("dropped", [BODY]))
    assert isinstance(got, web.Response) and got.status == 404
    with pytest.raises(ModelGoneError):
        pool.infer("dropped", [BODY])
    assert asyncio.run(runner.run("a", [BODY])) == [_answer(pool, "a")]


def test_a_layer_file_truncated_under_the_pool_is_a_503_and_written_anew(tmp_path: Path) -> None:
    """A mapped file that loses bytes raises SIGBUS on the next touch past its new end, which
    killed the whole pool (measured with BERT-base: its embeddings are read in place). Now
    each request checks the file first: that model's requests are 503s while its file is
    written anew in the background, the other models answer throughout, and it answers as
    before once rebuilt."""
    models = [{"name": "a", "spec": "tiny", "seed": 1}, {"name": "b", "spec": "tiny", "seed": 2}]
    pool = Pool(read_config(_config(tmp_path, models)))
    runner = _Runner(pool, max_queue=4, timeout_s=30, max_samples=4)
    want = {n: _answer(pool, n) for n in ("a", "b")}
    os.truncate(tmp_path / "files" / "a.layers", 3 * layerfile.PAGE)
    got = asyncio.run(runner.run("a", [BODY]))
    assert isinstance(got, web.Response) and got.status == 503
    assert _answer(pool, "b") == want["b"]
    deadline = time.monotonic() + 60
    while pool.models["a"].healing and time.monotonic() < deadline:
        time.sleep(0.05)  # the rebuild is a background thread: wait for it, bounded
    assert _answer(pool, "a") == want["a"]
    assert layerfile.LayerFile(tmp_path / "files" / "a.layers").intact()


def test_a_timed_out_request_keeps_its_queue_place_until_its_job_ends(tmp_path: Path) -> None:
    """``--max-queue`` bounds the jobs queued for the compute threads. Before, a 504 freed its
    place while its job stayed queued, so a client whose requests time out (a stalled model,
    a flood) queued jobs and their bodies without bound; now the places come back as the
    jobs end, and the requests beyond them are 503s."""
    pool = Pool(read_config(_config(tmp_path, [{"name": "a", "spec": "tiny"}], threads=1)))
    release = threading.Event()
    infer = pool.infer

    def stalled(name: str, bodies: Any) -> list[str]:
        release.wait(60)  # the compute thread is held (a model stuck on its disk)
        return infer(name, bodies)

    pool.infer = stalled  # type: ignore[method-assign]
    runner = _Runner(pool, max_queue=3, timeout_s=0.05, max_samples=4)

    async def five() -> list[int]:
        statuses = []
        for _ in range(5):
            got = await runner.run("a", [BODY])
            statuses.append(got.status if isinstance(got, web.Response) else 200)
        release.set()
        deadline = time.monotonic() + 30
        while runner.waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the stalled jobs finish: their places come back
        got = await runner.run("a", [BODY])
        statuses.append(got.status if isinstance(got, web.Response) else 200)
        return statuses

    assert asyncio.run(five()) == [504, 504, 504, 503, 503, 200]
    assert runner.waiting == 0
    runner.executor.shutdown()
