"""``packrat loadgen``: closed-loop bursts, open-loop Poisson or trace replay against an endpoint.

Bursts measure what Packrat optimizes, the latency of a batch of B requests arriving
together (until the last answer); Poisson arrivals measure per-request latency under a
steady rate. Results print as a table or JSON (with every request's record).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packrat.cli import CliError, add_command, check_numbers


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "loadgen",
        run,
        help="send bursts or Poisson load to a serving endpoint and report latency",
        description=(
            "Closed-loop bursts of B concurrent requests (batch latency = time until the last "
            "of the B answers) or open-loop Poisson arrivals at a rate."
        ),
    )
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", required=True, help="model name in /predictions/{model}")
    parser.add_argument(
        "--input",
        type=Path,
        help="request body file (.json sent as application/json); default: the zoo model's "
        "example input (needs --model, or --zoo, to be a zoo name)",
    )
    parser.add_argument("--zoo", help="zoo model whose example input to send (default: --model)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--burst", type=int, help="requests per burst B")
    mode.add_argument("--rate", type=float, help="Poisson arrival rate (requests per second)")
    mode.add_argument(
        "--trace",
        type=Path,
        help="replay arrival times open-loop: a CSV, one timestamp (s) per line or a "
        "'timestamp' column (what packrat provision reads)",
    )
    parser.add_argument("--bursts", type=int, default=10, help="number of bursts (default 10)")
    parser.add_argument("--warmup-bursts", type=int, default=1, help="unrecorded bursts first")
    parser.add_argument("--duration", type=float, default=10.0, help="Poisson duration (s)")
    parser.add_argument("--seed", type=int, default=0, help="Poisson arrival seed")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (s)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--records", action="store_true", help="with --format json: every request")


def request_body(args: argparse.Namespace) -> tuple[bytes, str]:
    if args.input is not None:
        try:
            data = args.input.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.input}: {exc}") from None
        kind = "application/json" if args.input.suffix == ".json" else "application/octet-stream"
        return data, kind
    from packrat.runtime import zoo
    from packrat.serve.codec import example_body

    spec = args.zoo or args.model
    if not zoo.is_zoo_name(spec):
        raise CliError(f"{spec} is not a zoo model: give the request body with --input FILE")
    return example_body(spec), "application/octet-stream"


# a load generator's own bounds: one burst, and the bursts of a run, as a client can hold
MAX_BURST = 100_000
MAX_TIMEOUT_S = 3600.0


def _check(args: argparse.Namespace) -> None:
    """Every number finite and in range, one line each (nan, inf and 1e308 were taken: an
    endless run, or a traceback, issue 38)."""
    from packrat.plan.traces import MAX_ARRIVALS, MAX_TRACE_SPAN_S

    check_numbers(args, "rate", "timeout", above=0)
    check_numbers(args, "timeout", at_most=MAX_TIMEOUT_S)
    check_numbers(args, "duration", above=0, at_most=MAX_TRACE_SPAN_S)
    check_numbers(args, "burst", "bursts", at_least=1, at_most=MAX_BURST)
    check_numbers(args, "warmup_bursts", at_least=0, at_most=MAX_BURST)
    check_numbers(args, "seed", at_least=0)
    if args.rate is not None and args.rate * args.duration > MAX_ARRIVALS:
        raise CliError(
            f"--rate x --duration is {args.rate * args.duration:g} requests; at most {MAX_ARRIVALS}"
        )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from packrat.bench.loadgen import Target, format_summary, run_bursts, run_poisson

    _check(args)
    body, content_type = request_body(args)
    target = Target(
        url=args.url, model=args.model, body=body, content_type=content_type, timeout_s=args.timeout
    )
    result: Any
    if args.burst is not None:
        result = asyncio.run(
            run_bursts(
                target,
                burst=args.burst,
                bursts=args.bursts,
                warmup_bursts=max(args.warmup_bursts, 0),
            )
        )
    elif args.trace is not None:
        from packrat.bench.replay import run_trace
        from packrat.plan.traces import TraceError, load_trace

        try:
            arrivals = load_trace(args.trace)
        except TraceError as exc:
            raise CliError(str(exc)) from None
        result = asyncio.run(run_trace(target, arrivals_s=arrivals.tolist()))
    else:
        result = asyncio.run(
            run_poisson(target, rate=args.rate, duration_s=args.duration, seed=args.seed)
        )
    if args.format == "json":
        print(json.dumps(result.to_dict() if args.records else result.summary(), indent=2))
    else:
        print(format_summary(result.summary()))
    return 0 if result.errors == 0 else 1
