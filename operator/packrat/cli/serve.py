"""``packrat serve``: run one serving pod (TorchServe thin instances behind the dispatcher).

This is the serving container's command, and it runs the same on a laptop:
``packrat serve --model tiny --plan plan.json --port 8080``. The plan is the JSON that
``packrat plan --format json`` prints, from a file or from an environment variable (the
operator renders it into ``PACKRAT_PLAN``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from packrat.cli import (
    CliError,
    add_command,
    add_model_arg,
    check_model_exists,
    check_model_file,
    check_numbers,
)

RUNTIMES = ("native", "torchserve")  # packrat.serve.config.RUNTIMES (not imported: start fast)
DEFAULT_RUNTIME = "native"

MAX_PLAN_BYTES = 1024 * 1024

# The flags that are ServeOptions fields of the same name, passed on as parsed; the others
# are read, converted or checked first (_serve_options; a test holds the names to the fields).
PASSED_AS_GIVEN = (
    "model",
    "model_name",
    "host",
    "port",
    "grpc_port",
    "max_batch_delay_ms",
    "queue_limit",
    "drain_seconds",
    "drain_grace_seconds",
    "max_body_bytes",
    "max_buffered_bytes",
    "torchserve_port_base",
    "runtime",
)


def register(subparsers: Any) -> None:
    add_command(
        subparsers,
        "serve",
        run,
        help="serve a model with a Packrat plan behind one dispatcher port",
        description=(
            "Start one pinned worker per plan instance (native workers, or TorchServe on "
            "loopback) behind a dispatcher on the public port that speaks TorchServe's "
            "inference API and the Open Inference Protocol (v2)."
        ),
        groups=(
            _add_model_args,
            _add_dispatcher_args,
            _add_worker_args,
            _add_admin_token_args,
            _add_limit_args,
            _add_request_log_args,
        ),
    )


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """What to serve: the model, its plan and the runtime that runs the plan's instances."""
    add_model_arg(
        parser, help="zoo name, model file (TorchScript .pt, .pt2, .onnx) or model archive (.mar)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", type=Path, help="plan JSON file (packrat plan --format json)")
    source.add_argument("--plan-env", metavar="VAR", help="environment variable holding the plan")
    parser.add_argument(
        "--model-name", help="name in /predictions/{name} (default: zoo name or file stem)"
    )
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=DEFAULT_RUNTIME,
        help="what runs the plan's instances: native (workers forked from the pod's zygote, "
        "fed batches by the dispatcher over Unix sockets; no JVM) or torchserve (TorchServe on "
        f"loopback); default {DEFAULT_RUNTIME}",
    )
    parser.add_argument(
        "--artefacts",
        type=Path,
        help="folder of the engines' converted artefacts (packrat profile --engines ... "
        "--artefacts DIR), for a plan whose engine is not eager (native runtime only)",
    )


def _add_dispatcher_args(parser: argparse.ArgumentParser) -> None:
    """The dispatcher's port, queue, batch estimate and SIGTERM drain."""
    parser.add_argument("--host", default="0.0.0.0", help="dispatcher address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="dispatcher port (default 8080)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="also serve the Open Inference Protocol over gRPC on this port (the operator's "
        "pods use 8081; needs the grpc extra); default: no gRPC port",
    )
    parser.add_argument("--max-batch-delay-ms", type=int, default=5, help="TorchServe batch delay")
    parser.add_argument(
        "--queue-limit",
        type=int,
        default=1024,
        help="requests that may wait in the dispatcher (each instance already holds up to two "
        "batches) before it answers 503 with Retry-After (default 1024)",
    )
    parser.add_argument(
        "--batch-estimate",
        choices=("floor", "nearest"),
        default="nearest",
        help="how the batch-size estimate rounds the mean queue depth to a power of two: "
        "nearest (on a log scale, the default) or floor (Packrat's; reads burst-synchronised "
        "clients as half the burst)",
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=30.0, help="SIGTERM: longest wait for in-flight"
    )
    parser.add_argument(
        "--drain-grace-seconds",
        type=float,
        default=0.0,
        help="SIGTERM: keep accepting new connections (reporting not ready) this long before "
        "closing the port, for load balancers that notice a terminating pod late (default 0)",
    )


def _add_worker_args(parser: argparse.ArgumentParser) -> None:
    """Where and how the workers start: workdir, warm-up, cpus, weights, JVM, zygote."""
    parser.add_argument(
        "--workdir", type=Path, help="writable directory for archives, TorchServe temp and logs"
    )
    parser.add_argument(
        "--warmup-body",
        type=Path,
        help="request body for the warm-up batch of a .mar (zoo/TorchScript build their own)",
    )
    parser.add_argument(
        "--cpus",
        help="use these cpus instead of this process's cpuset (e.g. 0-3); must be a subset",
    )
    parser.add_argument(
        "--private-weights",
        action="store_true",
        help="every instance loads its own copy of the weights instead of mapping the pod's "
        "one shared file (the behaviour before shared weights; for comparisons)",
    )
    parser.add_argument(
        "--jvm-args",
        help="TorchServe's JVM flags, space-separated, instead of the defaults (the client "
        "compiler only: a faster start; the JVM's own defaults spend about 0.6 s more CPU "
        "at start and about 20%% less frontend CPU per request once warm)",
    )
    parser.add_argument(
        "--no-zygote",
        action="store_true",
        help="start every worker as its own fresh interpreter instead of forking it from the "
        "pod's zygote, which imported torch and mapped the weights once (for comparisons)",
    )


def _add_admin_token_args(parser: argparse.ArgumentParser) -> None:
    """The admin bearer token that enables POST /admin/plan (a file or a variable)."""
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="file holding a bearer token (a mounted Secret, read again when it changes; a "
        "file 'previous' beside it holds a second accepted token); enables POST /admin/plan "
        "(the in-pod plan switch), POST /admin/canary and GET /arrivals (without it these "
        "routes do not exist)",
    )
    token.add_argument(
        "--admin-token-env",
        metavar="VAR",
        help="environment variable holding the bearer token instead (every process the pod "
        "starts inherits it: prefer --admin-token-file)",
    )


# The dispatcher's bounds: (flag, type, default, help), declared in this order.
_LIMIT_FLAGS: tuple[tuple[str, type[int] | type[float], float | None, str], ...] = (
    (
        "--max-body-bytes",
        int,
        6 * 1024 * 1024,
        "largest request body; 413 beyond, before it is read (default 6 MiB, below "
        "TorchServe's own 6.5 MB)",
    ),
    (
        "--max-buffered-bytes",
        int,
        128 * 1024 * 1024,
        "request bytes buffered across all requests; 503 beyond (default 128 MiB)",
    ),
    ("--max-connections", int, 1024, "open client connections (1024)"),
    (
        "--max-connections-per-client",
        int,
        256,
        "open connections from one client address (256; a proxy in front of many "
        "clients may need more); beyond it, and beyond --max-connections, a connection is "
        "admitted for one health probe only",
    ),
    ("--header-timeout", float, 10.0, "seconds for a request head (10)"),
    ("--body-timeout", float, 30.0, "seconds for a request body (30)"),
    (
        "--torchserve-port-base",
        int,
        None,
        "TorchServe's first loopback port (default 9080, or $PACKRAT_TORCHSERVE_PORT_BASE; "
        "the next free block of 10 when taken)",
    ),
)


def _add_limit_args(parser: argparse.ArgumentParser) -> None:
    """The dispatcher's bounds on bodies, buffers, connections and timeouts."""
    limits = parser.add_argument_group("limits (docs/serving.md)")
    for flag, kind, default, help_text in _LIMIT_FLAGS:
        limits.add_argument(flag, type=kind, default=default, help=help_text)


def _add_request_log_args(parser: argparse.ArgumentParser) -> None:
    """Sampled request and response logging to a file or a CloudEvents sink."""
    logs = parser.add_argument_group(
        "request and response logging (off by default; docs/serving.md)"
    )
    logs.add_argument(
        "--request-log",
        metavar="SINK",
        help="log sampled predictions: stdout (as spec.requestLogging.sink), jsonl:PATH "
        "(jsonl:- is stdout) or an http(s):// CloudEvents sink",
    )
    logs.add_argument(
        "--request-log-sample-rate",
        type=float,
        default=1.0,
        help="fraction of predictions logged, in (0, 1] (default 1)",
    )
    logs.add_argument(
        "--request-log-mode",
        choices=["binary", "structured"],
        default="binary",
        help="CloudEvents HTTP binding mode (default binary)",
    )
    logs.add_argument(
        "--request-log-queue",
        type=int,
        default=1000,
        help="records waiting for the sink; beyond, dropped and counted (default 1000)",
    )
    logs.add_argument(
        "--request-log-max-body-bytes",
        type=int,
        default=64 * 1024,
        help="bytes of each body logged (default 64 KiB)",
    )
    logs.add_argument(
        "--request-log-timeout",
        type=float,
        default=5.0,
        help="total seconds per CloudEvents POST (default 5)",
    )
    logs.add_argument(
        "--request-log-egress-allow",
        metavar="CIDR",
        action="append",
        default=[],
        help="an address range the CloudEvents sink may reach beyond the cluster's private "
        "ranges (loopback, link-local and the like are refused unless allowed; repeatable)",
    )
    logs.add_argument(
        "--request-log-source",
        default="/packrat",
        help="the CloudEvents source attribute (default /packrat)",
    )


def payload_log_config(args: argparse.Namespace) -> Any:
    """The request log's settings, or None when it is off; one clear line when invalid."""
    if not args.request_log:
        return None
    from packrat.serve.dispatcher.payload_log import PayloadLogConfig, PayloadLogError

    try:
        return PayloadLogConfig(
            # "stdout", as the CRD's sink and the docs say it (docs-found item 1)
            sink="jsonl:-" if args.request_log == "stdout" else args.request_log,
            sample_rate=args.request_log_sample_rate,
            mode=args.request_log_mode,
            queue_size=args.request_log_queue,
            max_body_bytes=args.request_log_max_body_bytes,
            timeout_s=args.request_log_timeout,
            source=args.request_log_source,
            egress_allow=tuple(args.request_log_egress_allow),
        )
    except PayloadLogError as exc:
        raise CliError(str(exc)) from None


def read_plan_text(args: argparse.Namespace) -> tuple[str, str]:
    """The plan JSON and where it came from."""
    if args.plan is not None:
        from packrat.runtime.documents import DocumentError, read_capped_text

        try:
            return read_capped_text(args.plan, MAX_PLAN_BYTES), str(args.plan)
        except DocumentError as exc:
            raise CliError(f"plan {args.plan}: {exc}") from None
    text = os.environ.get(args.plan_env)
    if not text:
        raise CliError(f"environment variable {args.plan_env} is not set or empty")
    return text, f"${args.plan_env}"


def _check_numbers(args: argparse.Namespace) -> None:
    """The time flags finite and bounded, one line each, before anything starts (nan, inf and
    1e308 were taken, issue 38's siblings); the batch delay as the CRD's maxBatchDelayMs."""
    check_numbers(args, "drain_seconds", "drain_grace_seconds", at_least=0, at_most=3600)
    check_numbers(args, "header_timeout", "body_timeout", above=0)
    check_numbers(args, "header_timeout", "body_timeout", at_most=3600)
    check_numbers(args, "max_batch_delay_ms", at_least=0, at_most=10_000)


def run(args: argparse.Namespace) -> int:
    check_model_exists(args.model)
    _check_numbers(args)
    check_model_file(args.model, args.inputs)  # before the zygote: no worker traceback
    # Taken out of the environment before any process starts: no child (the zygote,
    # TorchServe, the workers and a user's handler code in them) inherits the token that can
    # reconfigure the pod, not even in its /proc/<pid>/environ.
    args.admin_token = os.environ.pop(args.admin_token_env, None) if args.admin_token_env else None
    if args.artefacts is not None:  # read by the workers (and the zygote they fork from)
        from packrat.runtime.engines.cache import ARTEFACTS_ENV

        os.environ[ARTEFACTS_ENV] = str(args.artefacts.resolve())
    zygote, workdir = _prestart(args)
    try:
        return _run(args, zygote=zygote, workdir=workdir)
    except CliError:
        if workdir is not None and args.workdir is None:  # bad input: no temporary litter
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        if zygote is not None:
            zygote.stop_now()  # nothing left to do after the pod stopped it


def _check_engine(engine: str, args: argparse.Namespace) -> None:
    """A plan's engine can run here, or one clear line before any worker starts."""
    if engine == "eager":
        return
    if args.runtime != "native":
        raise CliError(
            f"the plan runs on {engine}; the {args.runtime} runtime serves eager plans only "
            "(use --runtime native)"
        )
    from packrat.runtime.engines import EngineError
    from packrat.runtime.engines import engine as get_engine
    from packrat.runtime.engines.cache import find

    try:
        chosen = get_engine(engine)
        missing = chosen.missing()
        if missing is not None:
            raise CliError(missing)
        if args.artefacts is None:
            raise CliError(f"the plan runs on {engine}: give --artefacts DIR (packrat profile's)")
        find(args.artefacts, args.model, chosen)
    except EngineError as exc:
        raise CliError(str(exc)) from None


def _prestart(args: argparse.Namespace) -> tuple[Any, Path | None]:
    """Start the pod's zygote first: it is the longest part of the start (importing torch,
    writing the weight file), and the serving stack takes a third of a second to import."""
    if args.no_zygote:
        return None, None
    import tempfile

    from packrat.serve.zygote.process import prestart

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="packrat-serve-"))
    try:
        zygote = prestart(
            args.model, workdir, shared_weights=not args.private_weights, runtime=args.runtime
        )
    except Exception:  # e.g. an unreadable model file: the pod reports it as before
        return None, workdir
    return zygote, workdir


def _run(args: argparse.Namespace, *, zygote: Any, workdir: Path | None) -> int:
    import asyncio

    from packrat.serve.config import ServeConfigError, parse_plan
    from packrat.serve.native.runtime import NativeStartError
    from packrat.serve.pod.server import TorchServeGoneError, serve
    from packrat.serve.torchserve.archive import ArchiveError
    from packrat.serve.torchserve.process import TorchServeError
    from packrat.serve.zygote.process import ZygoteStartError
    from packrat.serve.zygote.shared_weights import SharedWeightsError

    text, origin = read_plan_text(args)
    payload_log = payload_log_config(args)
    cpus = _cpus(args)
    limits = _connection_limits(args)
    token = _admin_token(args)
    warmup = _warmup_body(args)
    try:
        plan = parse_plan(text, origin=origin)
        _check_engine(plan.engine, args)
        opts = _serve_options(
            args,
            plan=plan,
            zygote=zygote,
            workdir=workdir,
            payload_log=payload_log,
            cpus=cpus,
            limits=limits,
            token=token,
            warmup=warmup,
        )
        return asyncio.run(serve(opts))
    except (
        ServeConfigError,
        ArchiveError,
        TorchServeError,
        SharedWeightsError,
        ZygoteStartError,
        NativeStartError,
    ) as exc:
        raise CliError(str(exc)) from None
    except TorchServeGoneError as exc:  # not the user's input: exit 1, the log has the tail
        print(f"packrat serve: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1


def _cpus(args: argparse.Namespace) -> list[int] | None:
    """--cpus, checked against this process's cpuset (None: the whole cpuset)."""
    from packrat.runtime.cpus import allowed_cpus, parse_cpu_list

    if not args.cpus:
        return None
    try:
        cpus = parse_cpu_list(args.cpus)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    outside = sorted(set(cpus) - set(allowed_cpus()))
    if outside:
        raise CliError(f"--cpus {args.cpus}: cpus {outside} are outside this process's cpuset")
    return cpus


def _connection_limits(args: argparse.Namespace) -> Any:
    """The dispatcher's bounds, checked; returns its ConnectionLimits."""
    from packrat.serve.dispatcher.connections import ConnectionLimits

    if args.queue_limit < 0:
        raise CliError("--queue-limit must be >= 0")

    if not 1 <= args.max_body_bytes <= args.max_buffered_bytes:
        raise CliError("need 1 <= --max-body-bytes <= --max-buffered-bytes")
    try:
        limits = ConnectionLimits(
            max_connections=args.max_connections,
            header_timeout_s=args.header_timeout,
            max_per_client=args.max_connections_per_client,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.body_timeout <= 0:
        raise CliError("--body-timeout must be > 0")
    return limits


def _admin_token(args: argparse.Namespace) -> Any:
    """The admin token (a TokenFile, read again when it changes, or the variable's text),
    or None: no admin routes."""
    token: Any = None
    if args.admin_token_file is not None:
        from packrat.serve.auth import token_file

        try:
            token = token_file(args.admin_token_file)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    elif args.admin_token_env:
        token = (args.admin_token or "").strip()  # taken out of the environment at start
        if len(token) < 16:
            raise CliError(
                f"environment variable {args.admin_token_env} must hold a token of at least "
                "16 characters"
            )
    return token


def _warmup_body(args: argparse.Namespace) -> bytes | None:
    if args.warmup_body is None:
        return None
    try:
        body: bytes = args.warmup_body.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.warmup_body}: {exc}") from None
    return body


def _serve_options(
    args: argparse.Namespace,
    *,
    plan: Any,
    zygote: Any,
    workdir: Path | None,
    payload_log: Any,
    cpus: list[int] | None,
    limits: Any,
    token: Any,
    warmup: bytes | None,
) -> Any:
    """The pod's ServeOptions from the flags and what was read and checked above."""
    from packrat.serve.config import JVM_ARGS
    from packrat.serve.pod.server import ServeOptions

    return ServeOptions(
        **{name: getattr(args, name) for name in PASSED_AS_GIVEN},
        plan=plan,
        workdir=workdir,
        owns_workdir=workdir is not None and args.workdir is None,
        zygote_process=zygote,
        payload_log=payload_log,
        cpus=cpus,
        warmup_body=warmup,
        shared_weights=not args.private_weights,
        body_timeout_s=args.body_timeout,
        limits=limits,
        admin_token=token,
        zygote=not args.no_zygote,
        jvm_args=tuple(args.jvm_args.split()) if args.jvm_args else JVM_ARGS,
        estimator_rounding=args.batch_estimate,
    )
