"""``packrat serve``'s flags become the pod's ServeOptions: the flags passed on as given are
fields of the same name, and a command line's values arrive in the options."""

from __future__ import annotations

import dataclasses
import inspect

from packrat.cli import build_parser
from packrat.cli import serve as cli_serve
from packrat.serve.pod.server import ServeOptions

COMMAND = (
    "serve --model tiny --plan-env P --host 127.0.0.1 --port 9001 --grpc-port 9002 "
    "--queue-limit 7 --drain-seconds 3 --drain-grace-seconds 1 --max-batch-delay-ms 2 "
    "--model-name small --runtime torchserve --max-body-bytes 1000 --max-buffered-bytes 2000 "
    "--torchserve-port-base 9100 --body-timeout 4 --private-weights --no-zygote"
)


def test_the_flags_passed_as_given_are_options_of_the_same_name() -> None:
    fields = {f.name for f in dataclasses.fields(ServeOptions)}
    args = build_parser("serve").parse_args(COMMAND.split())
    assert set(cli_serve.PASSED_AS_GIVEN) <= fields
    assert set(cli_serve.PASSED_AS_GIVEN) <= set(vars(args))


def test_a_command_lines_values_arrive_in_the_options() -> None:
    args = build_parser("serve").parse_args([*COMMAND.split(), "--jvm-args", "-Xmx1g -Xss1m"])
    read_first = inspect.signature(cli_serve._serve_options).parameters
    opts = cli_serve._serve_options(args, **{name: None for name in read_first if name != "args"})
    assert isinstance(opts, ServeOptions)
    given = {name: getattr(opts, name) for name in cli_serve.PASSED_AS_GIVEN}
    assert given == {name: getattr(args, name) for name in cli_serve.PASSED_AS_GIVEN}
    assert given["host"] == "127.0.0.1" and given["torchserve_port_base"] == 9100
    assert (opts.body_timeout_s, opts.shared_weights, opts.zygote) == (4.0, False, False)
    assert opts.jvm_args == ("-Xmx1g", "-Xss1m")
