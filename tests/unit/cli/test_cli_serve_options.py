"""``packrat serve``'s flags become the pod's ServeOptions: the flags passed on as given are
fields of the same name, and a command line's values arrive in the options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from packrat.cli import build_parser
from packrat.cli import serve as cli_serve
from packrat.plan.optimizer import InstanceGroup, Plan
from packrat.serve.pod.server import ServeOptions


def test_the_flags_passed_as_given_are_options_of_the_same_name() -> None:
    fields = {f.name for f in dataclasses.fields(ServeOptions)}
    args = build_parser("serve").parse_args(["serve", "--model", "tiny", "--plan-env", "P"])
    assert set(cli_serve.PASSED_AS_GIVEN) <= fields
    assert set(cli_serve.PASSED_AS_GIVEN) <= set(vars(args))


def test_a_command_lines_values_arrive_in_the_options(tmp_path: Path) -> None:
    args = build_parser("serve").parse_args(
        [
            "serve",
            "--model",
            "tiny",
            "--plan-env",
            "P",
            "--host",
            "127.0.0.1",
            "--port",
            "9001",
            "--grpc-port",
            "9002",
            "--queue-limit",
            "7",
            "--drain-seconds",
            "3",
            "--max-batch-delay-ms",
            "2",
            "--model-name",
            "small",
            "--runtime",
            "torchserve",
            "--body-timeout",
            "4",
            "--private-weights",
            "--no-zygote",
            "--jvm-args",
            "-Xmx1g -Xss1m",
        ]
    )
    plan = Plan(
        cpus=1,
        batch=1,
        instances=(InstanceGroup(1, 1, 1),),
        expected_latency_ms=1.0,
        fat_latency_ms=1.0,
    )
    opts = cli_serve._serve_options(
        args,
        plan=plan,
        zygote=None,
        workdir=tmp_path,
        payload_log=None,
        cpus=[0],
        limits=None,
        token="a-token-of-16-chars",
        warmup=b"body",
    )
    assert isinstance(opts, ServeOptions)
    assert (opts.model, opts.model_name, opts.host, opts.port, opts.grpc_port) == (
        "tiny",
        "small",
        "127.0.0.1",
        9001,
        9002,
    )
    assert (opts.queue_limit, opts.drain_seconds, opts.max_batch_delay_ms) == (7, 3.0, 2)
    assert opts.runtime == "torchserve" and opts.body_timeout_s == 4.0
    assert opts.shared_weights is False and opts.zygote is False
    assert opts.jvm_args == ("-Xmx1g", "-Xss1m")
    # made for this run (no --workdir): removed after a clean exit
    assert (opts.workdir, opts.owns_workdir, opts.cpus, opts.warmup_body) == (
        tmp_path,
        True,
        [0],
        b"body",
    )
    assert opts.plan is plan and opts.admin_token == "a-token-of-16-chars"
