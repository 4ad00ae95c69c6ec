"""The pipeline tests' shared set-up: a fresh ``Cluster`` (tests/support/pipeline_support.py)
holding the two-stage pipeline ``chain``, nothing reconciled yet."""

from __future__ import annotations

import pytest
from pipeline_support import Cluster


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()
