"""The one ``packrat`` command over every layer.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``,
which declares it with :func:`add_command`.
Modules import heavy dependencies (torch, kopf) only inside their run functions, so
``packrat plan`` answers without loading torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packrat import __version__

# Subcommand modules, in the order ``packrat --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "plan",
    "provision",
    "simulate",
    "profile",
    "fetch",
    "convert",
    "bench",
    "serve",
    "route",
    "loadgen",
    "operator",
    "demo",
)


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def check_numbers(
    args: argparse.Namespace,
    *names: str,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> None:
    """Each flag in ``names`` that was given (not None) finite and ``> above`` or
    ``>= at_least`` (and ``<= at_most``), else one line: ``--flag must be > 0, got nan``."""
    for name in names:
        value = getattr(args, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if above is not None and not (math.isfinite(value) and value > above):
            raise CliError(f"{flag} must be > {above:g}, got {value}")
        if at_least is not None and not (math.isfinite(value) and value >= at_least):
            raise CliError(f"{flag} must be >= {at_least:g}, got {value}")
        if at_most is not None and not (math.isfinite(value) and value <= at_most):
            limit = int(at_most) if float(at_most).is_integer() else at_most
            raise CliError(f"{flag} must be <= {limit}, got {value}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser, or ``only`` that one's (:func:`main` when the command line
    names one: importing all eleven modules to run one took 0.2 s, on a serving pod's
    start path before it starts its zygote)."""
    parser = argparse.ArgumentParser(
        prog="packrat",
        description="Serve PyTorch models on CPU cores with Packrat's optimal thin instances.",
    )
    parser.add_argument("--version", action="version", version=f"packrat {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"packrat.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"packrat.cli.{name}":
                continue  # a subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def add_command(
    subparsers: Any,
    name: str,
    run: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
    groups: Sequence[Callable[[argparse.ArgumentParser], None]] = (),
) -> argparse.ArgumentParser:
    """Declare subcommand ``name``, which ``run`` runs: its parser, with each of ``groups`` (a
    function that adds one group of flags) added in order, as ``--help`` lists them; a
    command with few flags adds them to the parser returned."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description
    )
    for add_group in groups:
        add_group(parser)
    parser.set_defaults(func=run)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand the command line names (its first word that is not an option), if it
    is one; else None (``--help``, a typo: the full parser answers)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result: int = args.func(args)
    except CliError as exc:
        print(f"packrat {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user named that cannot be read or written, a port taken
        if args.verbose:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"packrat {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result


# -- the model file a command takes (``packrat profile``/``serve --model``) and its inputs ---
# A TorchScript (.pt), torch.export (.pt2) or ONNX (.onnx) file is checked before any worker
# or zygote starts: its inputs known (--inputs, else what the file says), the file loaded and
# a batch of two run through it; a model that fails is one line and exit 2, never a worker's
# traceback after the pod listens. (Here, not in a module of its own: ``packrat serve``
# imports no command module but its own.)
MODEL_FILES = (".pt", ".pth", ".ts", ".pt2", ".onnx")


def add_model_arg(parser: argparse.ArgumentParser, *, help: str) -> None:
    """``--model`` (required; what it may name is ``help``) and the ``--inputs`` of a model
    file, which :func:`check_model_file` checks together."""
    parser.add_argument("--model", required=True, help=help)
    add_inputs_arg(parser)


def add_inputs_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inputs",
        metavar="JSON|@FILE",
        help=(
            "a model file's inputs, as KServe/Triton give them: "
            '\'[{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]\' (-1: the batch), '
            "Triton's dims/data_type, or @FILE holding them or a sample v2 inference request; "
            "needed for a plain torch.jit.save file, checked against an ONNX graph"
        ),
    )


def add_sample_request_args(parser: argparse.ArgumentParser, *, help: str) -> None:
    """A ``.mar`` handler's sample request: ``--sample-request FILE`` (what it is for is
    ``help``), ``--sample-request-env VAR`` (the base64 body in VAR, as the operator's Jobs and
    init containers pass it) and ``--sample-content-type``; read by :func:`sample_request_file`."""
    parser.add_argument("--sample-request", type=Path, metavar="FILE", help=help)
    parser.add_argument(
        "--sample-request-env",
        metavar="VAR",
        help="like --sample-request, from the base64 text in environment variable VAR",
    )
    parser.add_argument(
        "--sample-content-type",
        default="application/octet-stream",
        help="the sample request's Content-Type (default application/octet-stream)",
    )


def sample_request_file(args: argparse.Namespace, workdir: Path) -> Path | None:
    """The sample request's file (an environment variable's body written under ``workdir``),
    None when neither flag was given; a bad flag is one line (:class:`CliError`)."""
    import base64
    import binascii
    import os

    if args.sample_request is not None and args.sample_request_env:
        raise CliError("give --sample-request or --sample-request-env, not both")
    if args.sample_request is not None:
        if not args.sample_request.is_file():
            raise CliError(f"--sample-request {args.sample_request}: no such file")
        return Path(args.sample_request)
    if not args.sample_request_env:
        return None
    text = os.environ.get(args.sample_request_env)
    if not text:
        raise CliError(f"--sample-request-env {args.sample_request_env}: variable is unset")
    try:
        body = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise CliError(f"--sample-request-env {args.sample_request_env}: not base64 text") from None
    path = workdir / "sample-request.bin"
    path.write_bytes(body)
    return path


def make_folder(path: Path, flag: str) -> None:
    """``path`` made (with its parents) if missing, or one line naming ``flag`` (a file, a
    folder under a file, no permission: before, a traceback once the work had begun)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"{flag} {path}: {exc.strerror or exc}") from None


def check_model_exists(model: str) -> None:
    """A zoo name or an existing file, or one clear line (before anything starts)."""
    from packrat.runtime import modelid

    if not modelid.is_zoo_name(model) and not Path(model).expanduser().is_file():
        raise CliError(modelid.unknown_model(model))


def check_model_file(model: str, inputs: str | None) -> None:
    """Declare ``inputs`` for every process this one starts and check the model file with
    them; a zoo name or ``.mar`` passes untouched (and takes no ``--inputs``)."""
    from packrat.runtime import inputs as declared
    from packrat.runtime import modelid

    is_file = not modelid.is_zoo_name(model) and Path(model).suffix.lower() in MODEL_FILES
    if not is_file:
        if inputs is not None:
            raise CliError(
                f"--inputs applies to a model file ({', '.join(MODEL_FILES)}), not {model}"
            )
        return
    if inputs is not None:
        try:
            declared.declare(declared.parse_option(inputs))
        except declared.InputsError as exc:
            raise CliError(str(exc)) from None
    if not Path(model).expanduser().is_file():
        raise CliError(modelid.unknown_model(model))
    from packrat.runtime import zoo
    from packrat.runtime.engines import EngineError

    try:
        zoo.check_model(model)
    except (zoo.ZooError, EngineError) as exc:
        raise CliError(str(exc)) from None
