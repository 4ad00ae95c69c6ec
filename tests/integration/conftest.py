"""Fixtures shared by the operator integration tests.

``cluster``: the kmock emulator, the test agent (kubelet, controllers, kube-proxy, garbage
collector) and the real ``packrat operator`` subprocess, one per test module. Tests in a module
share it and must not depend on each other's leftovers: state a test needs (a served, profiled
model) comes from helpers in ``models.py`` that create it when it is missing. The harness
modules (``tests/integration/operator``) are importable through pytest's ``pythonpath``
setting in pyproject.toml.

``tiny_profiles``: the tiny model's profile, measured once per run by the first test that
asks for it (once for all pytest-xdist workers: they share its folder), for the tests that are
not about profiling (``seeding.seed_profile`` hands it to a model), so they neither pay for nor
depend on a profile measured under their own load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from harness import OperatorCluster
from seeding import MeasuredProfiles


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[OperatorCluster]:
    stem = request.module.__name__.rsplit(".", 1)[-1]
    # a module that tests the in-pod switch says so (INPOD_SWITCH = True)
    inpod = bool(getattr(request.module, "INPOD_SWITCH", False))
    cluster = OperatorCluster(tmp_path_factory.mktemp(stem), inpod_switch=inpod)
    try:
        yield cluster
    finally:
        print(f"\n--- {stem}: operator log tail ---\n" + cluster.log_tail(40))
        if cluster.agent.errors:
            print("agent errors:", cluster.agent.errors[-5:])
        cluster.close()


@pytest.fixture(scope="session")
def tiny_profiles(tmp_path_factory: pytest.TempPathFactory) -> MeasuredProfiles:
    base = tmp_path_factory.getbasetemp()
    # under pytest-xdist each worker's base is a folder of the run's own base
    run_base = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = run_base / "tiny-profile"
    folder.mkdir(exist_ok=True)
    return MeasuredProfiles(folder)
