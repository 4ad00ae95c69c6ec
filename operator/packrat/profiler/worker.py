"""One model instance in its own process: ``python -m packrat.profiler.worker``.

Why a separate process: a profile point must be measured like a serving instance runs, by a
process pinned to exactly its ``t`` cores, with ``t`` intra-op threads and one inter-op
thread, set before torch starts any thread pool. Only a fresh process guarantees that (torch
refuses to change inter-op threads once parallel work has started, and OpenMP reads its
environment once), and it keeps one measurement's allocator and cache state from leaking
into the next.

With ``--archive`` the instance is a TorchServe model archive instead of a bare model: its
handler (the user's, or Packrat's native one) is loaded by TorchServe's own loader and one
batch of size b is b copies of ``--sample-request`` run through it (:mod:`packrat.runtime.mar`),
so a profile point includes the handler's pre- and post-processing, as serving does.

Protocol: one JSON object per line. The worker pins itself, loads the model, prints
``{"event": "ready", ...}`` and then answers one line per command read from stdin:
``info``, ``measure`` (the profiler's adaptive loop), ``warmup``, ``run`` (one timed batch,
for the benchmark's synchronised start) and ``exit``. Anything else the process prints goes
to stderr, so stdout carries the protocol only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from packrat.profiler.stats import precise_enough
from packrat.runtime.cpus import parse_cpu_list
from packrat.runtime.pinning import thread_env


def _thread_affinities() -> list[int]:
    """The union of the affinities of every thread of this process (OpenMP pools included)."""
    cpus: set[int] = set()
    try:
        tids = [int(p.name) for p in Path("/proc/self/task").iterdir() if p.name.isdigit()]
    except OSError:
        return sorted(os.sched_getaffinity(0))
    for tid in tids:
        try:
            cpus |= os.sched_getaffinity(tid)
        except OSError:
            continue
    return sorted(cpus)


@dataclass(slots=True)
class Target:
    """What a worker runs, loaded: the bare model, or an archive's handler with its request."""

    spec: str
    model: Any = None
    service: Any = None
    workdir: str | None = None
    load_s: float = 0.0
    sample_request: bytes = b""
    content_type: str = "application/octet-stream"
    engine: str = "eager"  # packrat.runtime.engines: what runs the batches
    artefact: str | None = None  # its converted artefact (loaded by the pinned worker)

    def cleanup(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def load_target(
    spec: str,
    *,
    archive: str | None = None,
    sample_request: bytes | None = None,
    content_type: str = "application/octet-stream",
    engine: str = "eager",
    artefact: str | None = None,
) -> Target:
    """Build the model (or load the archive's handler); the caller has set its threads.

    With a converted ``engine`` no model is built here: each pinned worker loads the artefact
    itself (:class:`Instance`), after the fork when forked, since engines' thread pools do
    not survive one; an archive's handler is loaded (eager) and its module swapped then."""
    from packrat.runtime.zoo import load_model

    start = time.perf_counter()
    target = Target(
        spec=spec,
        sample_request=sample_request or b"",
        content_type=content_type,
        engine=engine,
        artefact=artefact,
    )
    if archive is not None:  # on an engine, each pinned worker swaps its module (Instance)
        from packrat.runtime.mar import HandlerService

        target.workdir = tempfile.mkdtemp(prefix="packrat-profile-")
        target.service = HandlerService(mar=Path(archive), workdir=Path(target.workdir))
    elif engine == "eager":
        target.model = load_model(spec)
    target.load_s = time.perf_counter() - start
    return target


class Instance:
    """The model, pinned, with cached example inputs per batch size.

    ``target`` is loaded by this process (a fresh worker, after pinning itself) or by the
    fork server this worker was forked from (``forked``: pinned after the fork, see
    :func:`run_forked`)."""

    def __init__(
        self, target: Target, *, cpus: Sequence[int], threads: int, forked: bool = False
    ) -> None:
        import torch

        from packrat.runtime.zoo import example_input

        self.torch = torch
        self.target = target
        self.spec = target.spec
        self.cpus = list(cpus)
        self.threads = threads
        self.forked = forked
        self.service: Any = target.service
        self.model: Any = target.model
        self.sample_request = target.sample_request
        self.content_type = target.content_type
        self.load_s = target.load_s
        self._example_input = example_input
        self._inputs: dict[int, Any] = {}
        self.engine = target.engine
        self.runner: Any = None
        if target.engine != "eager":  # this (pinned) process loads the artefact
            from packrat.runtime import engines

            began = time.perf_counter()
            artefact = Path(target.artefact) if target.artefact else None
            self.runner = engines.engine(target.engine).load(artefact, model=None, threads=threads)
            if self.service is not None and artefact is not None:  # the handler calls it
                from packrat.runtime.engines.handler import artefact_inputs, swap

                swap(self.service, self.runner, artefact_inputs(artefact))
            self.engine_load_s = time.perf_counter() - began
            self.load_s += self.engine_load_s

    @classmethod
    def fresh(cls, load: Callable[[], Target], *, cpus: Sequence[int], threads: int) -> Instance:
        """Pin this (fresh) process, then import torch and ``load`` the model."""
        os.environ.update(thread_env(threads))
        os.environ.pop("PACKRAT_SERVE_CONFIG", None)  # pinned here, not by a serving config
        os.sched_setaffinity(0, set(cpus))  # before torch starts any thread
        from packrat.runtime.pinning import pin_current_process

        pin_current_process(cpus, threads=threads)
        return cls(load(), cpus=cpus, threads=threads)

    def _input(self, batch: int) -> Any:
        if batch not in self._inputs:
            self._inputs.clear()  # keep one batch's input alive at a time
            self._inputs[batch] = self._example_input(self.spec, batch)
        return self._inputs[batch]

    def once(self, batch: int) -> tuple[float, float]:
        """Run one batch; returns (start, end) on the system-wide monotonic clock (s)."""
        if self.service is not None:  # b copies of the sample request through the handler
            bodies = [self.sample_request] * batch
            start = time.monotonic()
            self.service.predict(bodies, content_type=self.content_type)
            return start, time.monotonic()
        x = self._input(batch)
        if self.runner is not None:
            inputs = x if isinstance(x, tuple) else (x,)
            start = time.monotonic()
            self.runner.run(inputs)
            return start, time.monotonic()
        with self.torch.inference_mode():
            start = time.monotonic()
            if isinstance(x, tuple):
                self.model(*x)
            else:
                self.model(x)
            end = time.monotonic()
        return start, end

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "cpus": self.cpus,
            "affinity": sorted(os.sched_getaffinity(0)),
            "thread_affinity": _thread_affinities(),
            "threads": self.torch.get_num_threads(),
            "interop_threads": self.torch.get_num_interop_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_s": self.load_s,
            "forked": self.forked,
            "engine": self.engine,
            "through": "handler" if self.service is not None else "model",
            "handler": self.service.handler if self.service is not None else None,
        }

    def cleanup(self) -> None:
        if not self.forked:  # a forked worker's target belongs to the fork server
            self.target.cleanup()

    def measure(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Warm up, then sample until the CI is within ``precision`` or the budget ends."""
        batch = int(msg["batch"])
        warmup = int(msg.get("warmup", 2))
        min_samples = int(msg.get("min_samples", 5))
        max_samples = int(msg.get("max_samples", 100_000))
        precision = float(msg.get("precision", 0.02))
        budget_s = float(msg.get("budget_s", 30.0))
        began = time.monotonic()
        warm_ms = []
        for _ in range(warmup):
            start, end = self.once(batch)
            warm_ms.append((end - start) * 1000.0)
        samples: list[float] = []
        stopped = "max_samples"
        wall0, cpu0 = time.monotonic(), time.process_time()
        while len(samples) < max_samples:
            start, end = self.once(batch)
            samples.append((end - start) * 1000.0)
            if precise_enough(samples, precision=precision, min_samples=min_samples):
                stopped = "precision"
                break
            if end - began >= budget_s:
                stopped = "budget"
                break
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        return {
            "batch": batch,
            "samples_ms": samples,
            # CPU time / (wall time x threads) while sampling: well below 1 means the cores
            # were shared with other work and the latencies are inflated.
            "cpu_share": cpu / (wall * self.threads) if wall > 0 else None,
            "warmup_ms": warm_ms,
            "stopped": stopped,
            "elapsed_s": time.monotonic() - began,
        }


def _serve(instance: Instance, lines: TextIO, out: Callable[[dict[str, Any]], None]) -> int:
    for line in lines:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            if cmd == "exit":
                out({"ok": True})
                return 0
            if cmd == "info":
                out(instance.info())
            elif cmd == "measure":
                out(instance.measure(msg))
            elif cmd == "warmup":
                batch = int(msg["batch"])
                runs = [instance.once(batch) for _ in range(int(msg.get("n", 1)))]
                out({"ms": [(e - s) * 1000.0 for s, e in runs]})
            elif cmd == "run":
                cpu0 = time.process_time()
                start, end = instance.once(int(msg["batch"]))
                out({"start": start, "end": end, "cpu_s": time.process_time() - cpu0})
            else:
                out({"error": f"unknown command {cmd!r}"})
        except Exception as exc:  # report, keep serving: the parent decides
            traceback.print_exc()
            out({"error": f"{type(exc).__name__}: {exc}"})
    return 0


def _protocol_out() -> Callable[[dict[str, Any]], None]:
    """stdout is the protocol channel: keep a private copy, send everything else to stderr."""
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def out(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    return out


def run_forked(target: Target, request: dict[str, Any]) -> int:
    """A worker forked from the fork server (:mod:`packrat.profiler.forked`): pin this process
    to its cores and set its threads before anything runs, then serve the protocol.

    After the fork this process has one thread and no thread pool (the server checked), so
    the affinity set here is inherited by every thread torch starts later, and the intra-op
    and inter-op counts are still free to set."""
    from packrat.runtime.pinning import pin_current_process

    out = _protocol_out()
    try:
        cpus = [int(c) for c in request["cpus"]]
        threads = int(request["threads"])
        os.environ.update(thread_env(threads))
        os.environ.pop("PACKRAT_SERVE_CONFIG", None)
        os.sched_setaffinity(0, set(cpus))
        pin_current_process(cpus, threads=threads)
        instance = Instance(target, cpus=cpus, threads=threads, forked=True)
    except Exception as exc:
        traceback.print_exc()
        out({"event": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    out({"event": "ready", **instance.info()})
    return _serve(instance, sys.stdin, out)


def add_target_args(parser: argparse.ArgumentParser, *, engine_help: str) -> None:
    """The flags naming what a worker runs (the model, or an archive's handler and its
    request, on an engine): this module's and the fork server's (:mod:`.forked`)."""
    parser.add_argument("--model", required=True, help="zoo name or TorchScript file")
    parser.add_argument("--archive", help="a TorchServe .mar whose handler to run")
    parser.add_argument("--sample-request", help="file: the request body for --archive")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--engine", default="eager", help=engine_help)
    parser.add_argument("--artefact", help="the engine's converted artefact")


def target_from_args(args: argparse.Namespace) -> Target:
    """:func:`load_target` for what :func:`add_target_args`' flags name."""
    sample = Path(args.sample_request).read_bytes() if args.sample_request else None
    return load_target(
        args.model,
        archive=args.archive,
        sample_request=sample,
        content_type=args.content_type,
        engine=args.engine,
        artefact=args.artefact,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.profiler.worker")
    add_target_args(parser, engine_help="the engine to run the batches")
    parser.add_argument("--cpus", required=True, help="cpu list to pin to, e.g. 2-3")
    parser.add_argument("--threads", type=int, required=True, help="intra-op threads")
    args = parser.parse_args(argv)

    out = _protocol_out()
    try:
        instance = Instance.fresh(
            lambda: target_from_args(args), cpus=parse_cpu_list(args.cpus), threads=args.threads
        )
    except Exception as exc:
        traceback.print_exc()
        out({"event": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    out({"event": "ready", **instance.info()})
    try:
        return _serve(instance, sys.stdin, out)
    finally:
        instance.cleanup()


if __name__ == "__main__":
    sys.exit(main())
