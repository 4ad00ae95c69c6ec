"""Suite-wide pytest options: run the collected tests in another order, to show that no test
depends on the state an earlier one left (``--reverse``, or ``--shuffle SEED``).

These machines are shared: a profile's spare-CPU check finds busy cores on most runs, and the
profiler would (rightly) refuse to store what it measured. Tests of other behaviour allow
contended profiles (``PACKRAT_ALLOW_CONTENDED=1``); the tests of the refusal clear it.

Hypothesis runs without its per-example deadline and its too-slow health check: both are
timing assertions, and on two shared cores an example that takes 150 ms alone took 460 ms
(``test_profiler_layout`` failed on it under load). What the properties assert is unchanged.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("packrat", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("packrat")

os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")


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
