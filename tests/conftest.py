"""Suite-wide pytest options: run the collected tests in another order, to show that no test
depends on the state an earlier one left (``--reverse``, or ``--shuffle SEED``)."""

from __future__ import annotations

import random

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("order", "test order (independence checks)")
    group.addoption(
        "--reverse", action="store_true", help="run the collected tests in reverse order"
    )
    group.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the collected tests in a random order drawn from SEED",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    if config.getoption("--reverse"):
        items.reverse()


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    order = [f"shuffled (seed {seed})"] if seed is not None else []
    order += ["reversed"] if config.getoption("--reverse") else []
    return f"test order: {', '.join(order)}" if order else None
