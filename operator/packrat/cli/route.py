"""``packrat route --config router.yaml``: a pipeline's entry point, the DAG over its stages.

Runs :class:`packrat.serve.router.Router` on one port (``POST /predictions/{pipeline}``,
``GET /ping``, ``GET /metrics``; ``GET /arrivals`` with ``--admin-token-file``) with the
dispatcher's connection limits. The config names
the stages' prediction URLs, the edges and the deadlines
(:func:`packrat.serve.router.parse_router_config`). Bad config: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from packrat.cli import CliError, add_command

MAX_CONFIG_BYTES = 1024 * 1024  # a ConfigMap's limit: the operator renders it into one


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "route",
        run,
        help="run a pipeline's router: the DAG of stages over their Services",
        description=(
            "Serve a pipeline on one port: each query goes through the stages its path takes "
            "(edges drawn by their fractions), with errors and deadlines kept per query."
        ),
    )
    parser.add_argument("--config", required=True, type=Path, help="router config YAML")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    parser.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="file holding the pipeline's bearer token (a mounted Secret, read again when it "
        "changes; a file 'previous' beside it holds a second accepted token); enables GET "
        "/arrivals (without it that route does not exist)",
    )


def run(args: argparse.Namespace) -> int:
    import yaml

    from packrat.plan.pipeline.simulate import PipelineError
    from packrat.runtime.documents import DocumentError, read_capped_text
    from packrat.serve.router import Router, parse_router_config

    if not 0 < args.port < 65536:
        raise CliError(f"--port must be in 1..65535, got {args.port}")
    try:
        text = read_capped_text(args.config, MAX_CONFIG_BYTES)
    except DocumentError as exc:
        raise CliError(f"{args.config}: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise CliError(f"{args.config}: not valid YAML") from None
    except RecursionError:
        raise CliError(f"{args.config}: nested too deeply") from None
    try:
        config = parse_router_config(doc, origin=str(args.config))
    except PipelineError as exc:
        raise CliError(str(exc)) from None
    token = None
    if args.admin_token_file is not None:
        from packrat.serve.auth import token_file

        try:
            token = token_file(args.admin_token_file)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    asyncio.run(_serve(Router(config, admin_token=token), args.host, args.port))
    return 0


async def _serve(router: Any, host: str, port: int) -> None:
    """Serve ``router`` through its guarded runner (connection cap, per-client share, probe
    reserve, head deadline) until SIGTERM or SIGINT."""
    from aiohttp import web

    runner = router.runner()
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host, port).start()
        await stop.wait()
    finally:
        await runner.cleanup()
