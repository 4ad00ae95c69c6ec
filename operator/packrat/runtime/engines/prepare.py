"""Convert a model for one engine (or find it converted) and check it against eager, in its
own process: ``python -m packrat.runtime.engines.prepare --model SPEC --engine NAME --root DIR``.

Its own process because a converted engine may crash the interpreter (a bad kernel, a
library's abort): the profiler reads one JSON line on stdout, and a child that dies or
prints nothing is an engine left out, with the reason, never a dead profiling Job.

The JSON: ``{"engine", "status": "ok" | "excluded", "reason", "artefact": {...},
"converted_now", "check": {"worst": ...}, "load_s"}``.
"""

from __future__ import annotations

import argparse
import json
import os
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


def prepare(spec: str, engine_name: str, root: Path, *, threads: int = 1) -> dict[str, Any]:
    """Convert (or find) and check; every failure is a verdict, not an exception."""
    import torch

    from packrat.runtime import engines
    from packrat.runtime.engines import cache, check
    from packrat.runtime.zoo import example_input, load_model, model_digest, model_name

    torch.set_num_threads(threads)
    out: dict[str, Any] = {"engine": engine_name, "status": "excluded", "reason": ""}
    try:
        engine = engines.engine(engine_name)
        missing = engine.missing()
        if missing is not None:
            return {**out, "reason": missing}
        specs = engines.input_specs(spec)
        artefact = cache.converted(
            engine,
            root=root,
            model_name=model_name(spec),
            digest=model_digest(spec),
            inputs=specs,
            build=lambda: load_model(spec),
        )
        out["artefact"] = artefact.to_record()
        out["converted_now"] = artefact.converted_now
        model = load_model(spec)
        began = time.monotonic()
        runner = engine.load(artefact.path, model=model, threads=threads)
        out["load_s"] = round(time.monotonic() - began, 3)
        fault = fault_for(engine_name)
        if fault is not None:
            runner = _Faulty(runner, fault)
        eager = engines.engine(engines.EAGER).load(None, model=model, threads=threads)
        x = example_input(spec, 2)
        sample = x if isinstance(x, tuple) else (x,)
        verdict = check.check_engine(runner, eager, specs, sample_input=sample)
    except Exception as exc:  # conversion or loading failed: the engine is left out
        return {**out, "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    out["check"] = {"worst": round(verdict.worst, 4), "tolerances": check.TOLERANCES}
    if not verdict.ok:
        return {**out, "reason": f"differs from eager: {verdict.reason}"}
    return {**out, "status": "ok"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.runtime.engines.prepare")
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # libraries' chatter goes to stderr
    result = prepare(args.model, args.engine, args.root, threads=args.threads)
    proto.write(json.dumps(result) + "\n")
    proto.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
