"""``packrat operator`` parses its flags and refuses to start without a namespace scope."""

from __future__ import annotations

import pytest

from packrat.cli import CliError, build_parser


def test_operator_flags_parse() -> None:
    args = build_parser().parse_args(
        [
            "operator",
            "--namespace",
            "a",
            "-n",
            "b",
            "--liveness",
            "http://0.0.0.0:8081/healthz",
            "--metrics-port",
            "9090",
            "--peering",
            "packrat",
        ]
    )
    assert args.namespace == ["a", "b"]
    assert args.metrics_port == 9090
    assert args.peering == "packrat"
    assert not args.all_namespaces


def test_namespace_and_all_namespaces_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-n", "a", "--all-namespaces"])


def test_operator_needs_a_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    args = build_parser().parse_args(["operator"])
    with pytest.raises(CliError, match="--namespace"):
        args.func(args)


@pytest.mark.parametrize("seconds", ["60", "-1", "599", "inf", "1e400", "nan"])
def test_a_rotation_shorter_than_the_propagation_window_is_refused(seconds: str) -> None:
    args = build_parser().parse_args(
        ["operator", "-n", "a", "--admin-token-rotation-seconds", seconds]
    )
    with pytest.raises(CliError, match="--admin-token-rotation-seconds must be 0"):
        args.func(args)


def test_the_rotation_defaults_to_a_day() -> None:
    args = build_parser().parse_args(["operator", "-n", "a"])
    assert args.admin_token_rotation_seconds == 86400
