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
from pathlib import Path
from typing import Any

from packrat.cli import (
    CliError,
    add_command,
    add_inputs_arg,
    check_model_exists,
    check_model_file,
    make_folder,
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
    parser.add_argument("--model", required=True, help="zoo name or model file")
    parser.add_argument(
        "--engines",
        required=True,
        help="engines, comma-separated (inductor, onnxruntime, openvino), or 'all' installed; "
        "eager needs no artefact",
    )
    parser.add_argument("--artefacts", type=Path, required=True, help="the artefact cache folder")
    parser.add_argument("--threads", type=int, default=1, help="threads for the check (default 1)")
    add_inputs_arg(parser)


MAX_THREADS = 256  # --threads 100000 crashed the check's process (SIGSEGV)


def run(args: argparse.Namespace) -> int:
    from packrat.profiler.engines import prepare_engine
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
    for name in wanted:
        if name == EAGER:
            continue
        record = prepare_engine(args.model, name, args.artefacts, threads=args.threads)
        path = (record.get("artefact") or {}).get("path")
        if record["status"] != "ok" and path:  # converted but wrong: never servable
            shutil.rmtree(Path(path).parent, ignore_errors=True)
        if record["status"] == "ok":
            how = "found converted" if not record.get("converted_now") else "converted"
            print(f"engine {name}: {how}, matches eager", file=sys.stderr, flush=True)
        else:
            print(f"engine {name} left out: {record['reason']}", file=sys.stderr, flush=True)
        print(json.dumps(record), flush=True)
    return 0
