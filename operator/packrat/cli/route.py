"""``packrat route --config router.yaml``: a pipeline's entry point, the DAG over its stages.

Runs :class:`packrat.serve.router.Router` on one port (``POST /predictions/{pipeline}``,
``GET /ping``, ``GET /metrics``). The config names the stages' prediction URLs, the edges
and the deadlines (:func:`packrat.serve.router.parse_router_config`). Bad config: one line,
exit status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packrat.cli import CliError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "route",
        help="run a pipeline's router: the DAG of stages over their Services",
        description=(
            "Serve a pipeline on one port: each query goes through the stages its path takes "
            "(edges drawn by their fractions), with errors and deadlines kept per query."
        ),
    )
    parser.add_argument("--config", required=True, type=Path, help="router config YAML")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml
    from aiohttp import web

    from packrat.plan.pipeline.simulate import PipelineError
    from packrat.serve.router import Router, parse_router_config

    if not 0 < args.port < 65536:
        raise CliError(f"--port must be in 1..65535, got {args.port}")
    try:
        text = args.config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{args.config}: cannot read: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise CliError(f"{args.config}: not valid YAML") from None
    try:
        config = parse_router_config(doc, origin=str(args.config))
    except PipelineError as exc:
        raise CliError(str(exc)) from None
    router = Router(config)
    web.run_app(router.app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0
