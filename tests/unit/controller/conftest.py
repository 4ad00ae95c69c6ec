"""The controller tests' shared set-ups, as fixtures: the in-memory API server, the model
``tiny`` (set up, or profiled and serving) and the fake pod client. Their types and the helpers
that play the controllers' part live in tests/support/kube_support.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kube_support import FakeFanout, FakeKube, ModelSetUp, ready_model, setup_model


@pytest.fixture
def kube() -> FakeKube:
    """An empty in-memory API server."""
    return FakeKube()


@pytest.fixture
def fanout() -> FakeFanout:
    """The operator's pod client, answering from the tables the test fills in."""
    return FakeFanout()


@pytest.fixture
def new_model() -> ModelSetUp:
    """The model ``tiny`` (``TINY_SPEC``) created, not reconciled yet: its API and reconciler."""
    return setup_model()


@pytest.fixture
def make_model() -> Callable[[dict[str, Any]], ModelSetUp]:
    """Creates ``tiny`` with the given spec (not reconciled yet): its API and reconciler."""
    return setup_model


@pytest.fixture
def served_model() -> ModelSetUp:
    """The model ``tiny`` profiled and serving from slot a (phase Ready)."""
    return ready_model()
