"""``packrat convert``: the serving pod's engine init container (convert or find, then check).

``packrat convert --model resnet50 --engines onnxruntime,openvino --artefacts /artefacts``
gives each engine's artefact for the model in the keyed cache folder (model digest, engine,
engine version, input specs: :mod:`packrat.runtime.engines.cache`), found there when the
profiling Job or another pod already converted it onto the same volume, converted otherwise,
and checks it against eager with the profile's own gate
(:mod:`packrat.runtime.engines.prepare`, each engine in its own process). An engine that fails
the gate has its artefact removed, so ``packrat serve --artefacts`` can never load it (a plan
on it fails with one line); a missing extra is one line and nothing converted. Prints one
JSON line per engine on stdout; exit 0 once every engine has its verdict.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from packrat.cli import (
    CliError,
    add_command,
    add_inputs_arg,
    add_sample_request_args,
    check_model_exists,
    check_model_file,
    make_folder,
    sample_request_file,
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "convert",
        run,
        help="convert a model for engines (or find it converted) and check it against eager",
        description=(
            "Give each engine's converted artefact in --artefacts (found by the cache key or "
            "converted now), checked against eager as packrat profile checks it; an engine that "
            "disagrees has its artefact removed. The serving pod's init container."
        ),
    )
    parser.add_argument("--model", required=True, help="zoo name, model file or .mar archive")
    parser.add_argument(
        "--engines",
        required=True,
        help="engines, comma-separated (inductor, onnxruntime, openvino), or 'all' installed; "
        "eager needs no artefact",
    )
    parser.add_argument("--artefacts", type=Path, required=True, help="the artefact cache folder")
    parser.add_argument("--threads", type=int, default=1, help="threads for the check (default 1)")
    add_inputs_arg(parser)
    add_sample_request_args(
        parser,
        help="a request body a .mar's handler accepts (required for a .mar): its module's "
        "inputs are captured from it, as the profile captured them",
    )


MAX_THREADS = 256  # --threads 100000 crashed the check's process (SIGSEGV)


def run(args: argparse.Namespace) -> int:
    from packrat.runtime.engines import EAGER, EngineError, parse_engines

    if not 1 <= args.threads <= MAX_THREADS:
        raise CliError(f"--threads must be in 1..{MAX_THREADS}, got {args.threads}")
    check_model_file(args.model, args.inputs)  # a model file's inputs, before any conversion
    check_model_exists(args.model)  # before: every engine 'left out', exit 0
    try:
        wanted = parse_engines(args.engines, allow_missing=True)  # missing: left out, said
    except EngineError as exc:
        raise CliError(f"--engines: {exc}") from None
    if not wanted:
        raise CliError(f"--engines: no engine named in {args.engines!r}")
    make_folder(args.artefacts, "--artefacts")
    with tempfile.TemporaryDirectory(prefix="packrat-convert-") as tmp:
        handler = _handler(args, Path(tmp))
        for name in wanted:
            if name != EAGER:
                _convert(args, name, handler)
    return 0


def _handler(args: argparse.Namespace, workdir: Path) -> Any:
    """A ``.mar``'s sample request as the profiler takes it; None for anything else."""
    from packrat.profiler.client import HandlerTarget
    from packrat.runtime.mar import is_archive

    sample = sample_request_file(args, workdir)
    if not is_archive(args.model):
        if sample is not None:
            raise CliError("--sample-request applies to a .mar, not " + args.model)
        return None
    if sample is None:
        raise CliError(
            f"{args.model}: a .mar's engines convert its handler's module from a request it "
            "accepts; give --sample-request FILE (or --sample-request-env VAR)"
        )
    return HandlerTarget(
        archive=Path(args.model), sample_request=sample, content_type=args.sample_content_type
    )


def _convert(args: argparse.Namespace, name: str, handler: Any) -> None:
    """One engine's verdict: said in a line on stderr, its record a JSON line on stdout."""
    from packrat.profiler.engines import prepare_engine

    record = prepare_engine(args.model, name, args.artefacts, threads=args.threads, handler=handler)
    path = (record.get("artefact") or {}).get("path")
    if record["status"] != "ok" and path:  # converted but wrong: never servable
        shutil.rmtree(Path(path).parent, ignore_errors=True)
    if record["status"] == "ok":
        how = "found converted" if not record.get("converted_now") else "converted"
        print(f"engine {name}: {how}, matches eager", file=sys.stderr, flush=True)
    else:
        print(f"engine {name} left out: {record['reason']}", file=sys.stderr, flush=True)
    print(json.dumps(record), flush=True)
