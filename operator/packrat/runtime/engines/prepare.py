"""Convert a model for one engine (or find it converted) and check it against eager, in its
own process: ``python -m packrat.runtime.engines.prepare --model SPEC --engine NAME --root DIR``.

Its own process because a converted engine may crash the interpreter (a bad kernel, a
library's abort): the profiler reads one JSON line on stdout, and a child that dies or
prints nothing is an engine left out, with the reason, never a dead profiling Job.

A ``.mar`` takes ``--sample-request FILE [--content-type T]``: its handler's module is
converted (:mod:`packrat.runtime.engines.handler`), its inputs captured from that request.

The JSON: ``{"engine", "status": "ok" | "excluded", "reason", "artefact": {...},
"converted_now", "check": {"worst": ...}, "load_s"}``, and ``"handler": "eager"`` for a
``.mar`` whose handler has no module an engine can take (no engine can: said once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Test hook: PACKRAT_ENGINE_FAULT=<engine>:wrong makes that engine's outputs 1% off, =<engine>:crash
# makes it raise: how the tests show that a disagreeing or crashing engine is never served.
FAULT_ENV = "PACKRAT_ENGINE_FAULT"


class _Faulty:
    def __init__(self, inner: Any, fault: str) -> None:
        self.inner = inner
        self.fault = fault

    def run(self, inputs: Any) -> Any:
        if self.fault == "crash":
            raise RuntimeError("injected fault")
        out = self.inner.run(inputs)
        return tuple(o * 1.01 for o in out) if isinstance(out, tuple) else out * 1.01

    def memory(self) -> dict[str, int]:
        return dict(self.inner.memory())


def fault_for(engine: str) -> str | None:
    """The fault injected into ``engine`` by the test hook, if any."""
    name, _, fault = os.environ.get(FAULT_ENV, "").partition(":")
    return fault if name == engine and fault in ("wrong", "crash") else None


def prepare(
    spec: str,
    engine_name: str,
    root: Path,
    *,
    threads: int = 1,
    sample_request: bytes | None = None,
    content_type: str = "application/octet-stream",
) -> dict[str, Any]:
    """Convert (or find) and check; every failure is a verdict, not an exception. A ``.mar``
    (with its ``sample_request``) has its handler's module converted (:mod:`.handler`)."""
    import torch

    from packrat.runtime import engines
    from packrat.runtime.engines import cache
    from packrat.runtime.mar import is_archive
    from packrat.runtime.zoo import example_input, load_model, model_digest, model_name

    torch.set_num_threads(threads)
    out: dict[str, Any] = {"engine": engine_name, "status": "excluded", "reason": ""}
    try:
        engine = engines.engine(engine_name)
        missing = engine.missing()
        if missing is not None:
            return {**out, "reason": missing}
        if is_archive(spec):
            return _prepare_archive(
                spec,
                engine,
                root,
                out,
                body=sample_request,
                content_type=content_type,
                threads=threads,
            )
        specs = engines.input_specs(spec)
        artefact = cache.converted(
            engine,
            root=root,
            model_name=model_name(spec),
            digest=model_digest(spec),
            inputs=specs,
            build=lambda: load_model(spec),
        )
        x = example_input(spec, 2)
        sample = x if isinstance(x, tuple) else (x,)
        return _gate(engine, artefact, load_model(spec), sample, out, threads=threads)[0]
    except Exception as exc:  # conversion or loading failed: the engine is left out
        return {**out, "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}


def _gate(
    engine: Any,
    artefact: Any,
    model: Any,
    sample: Sequence[Any],
    out: dict[str, Any],
    *,
    threads: int,
) -> tuple[dict[str, Any], Any]:
    """Load the converted ``artefact`` and compare it with eager ``model``: the verdict, and
    the runner that passed (None when it did not)."""
    from packrat.runtime import engines
    from packrat.runtime.engines import check

    out = {**out, "artefact": artefact.to_record(), "converted_now": artefact.converted_now}
    began = time.monotonic()
    runner = engine.load(artefact.path, model=model, threads=threads)
    out["load_s"] = round(time.monotonic() - began, 3)
    fault = fault_for(engine.name)
    if fault is not None:
        runner = _Faulty(runner, fault)
    eager = engines.engine(engines.EAGER).load(None, model=model, threads=threads)
    verdict = check.check_engine(runner, eager, artefact.inputs, sample_input=sample)
    out["check"] = {"worst": round(verdict.worst, 4), "tolerances": check.TOLERANCES}
    if not verdict.ok:
        return {**out, "reason": f"differs from eager: {verdict.reason}"}, None
    return {**out, "status": "ok"}, runner


def _prepare_archive(
    spec: str,
    engine: Any,
    root: Path,
    out: dict[str, Any],
    *,
    body: bytes | None,
    content_type: str,
    threads: int,
) -> dict[str, Any]:
    """A ``.mar``: load its handler, capture its module's inputs from the sample request,
    then convert and gate the module like any model. A handler with no module an engine can
    take is ``"handler": "eager"``: the archive runs eager, whichever engine was asked."""
    import tempfile

    from packrat.runtime.engines import cache, handler
    from packrat.runtime.mar import HandlerService
    from packrat.runtime.zoo import model_digest, model_name

    if body is None:
        raise ValueError("a .mar's engines need its sample request (--sample-request)")
    workdir = Path(tempfile.mkdtemp(prefix="packrat-prepare-"))
    try:
        service = HandlerService(mar=Path(spec), workdir=workdir)
        try:
            captured = handler.capture(service, body, content_type=content_type)
        except handler.HandlerModuleError as exc:
            reason = f"handler {service.handler}: {exc}; the archive runs eager"
            return {**out, "reason": reason, "handler": "eager"}
        name, digest = model_name(spec), model_digest(spec)
        handler.record_inputs(root, name=name, digest=digest, inputs=captured.inputs)
        artefact = cache.converted(
            engine,
            root=root,
            model_name=name,
            digest=digest,
            inputs=captured.inputs,
            build=lambda: captured.module,
        )
        record, runner = _gate(
            engine, artefact, captured.module, captured.sample, out, threads=threads
        )
        if runner is not None:  # and the handler itself takes it (no parameters, say)
            handler.swap(service, runner, captured.inputs)
            try:
                service.predict([body] * handler.CAPTURE_BATCH, content_type=content_type)
            except Exception as exc:
                first = f"{exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
                return {**record, "status": "excluded", "reason": f"the handler fails: {first}"}
        return record
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.runtime.engines.prepare")
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample-request", type=Path, help="a .mar's sample request body")
    parser.add_argument("--content-type", default="application/octet-stream")
    args = parser.parse_args(argv)
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # libraries' chatter goes to stderr
    body = args.sample_request.read_bytes() if args.sample_request is not None else None
    result = prepare(
        args.model,
        args.engine,
        args.root,
        threads=args.threads,
        sample_request=body,
        content_type=args.content_type,
    )
    proto.write(json.dumps(result) + "\n")
    proto.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
