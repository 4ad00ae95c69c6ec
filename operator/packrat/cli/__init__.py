"""The one ``packrat`` command over every layer.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``.
Modules import heavy dependencies (torch, kopf) only inside their run functions, so
``packrat plan`` answers without loading torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from packrat import __version__

# Subcommand modules, in the order ``packrat --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "plan",
    "provision",
    "simulate",
    "profile",
    "fetch",
    "bench",
    "serve",
    "route",
    "loadgen",
    "operator",
    "demo",
)


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="packrat",
        description="Serve PyTorch models on CPU cores with Packrat's optimal thin instances.",
    )
    parser.add_argument("--version", action="version", version=f"packrat {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"packrat.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"packrat.cli.{name}":
                continue  # a subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    except KeyboardInterrupt:
        return 130
    return result
