"""Unit tests for packrat.runtime.pinning (the test process is restored afterwards)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import torch

from packrat.runtime.cpus import allowed_cpus
from packrat.runtime.pinning import pin_current_process, reader_split, thread_env


@pytest.fixture
def restore_process() -> Iterator[None]:
    affinity = os.sched_getaffinity(0)
    threads = torch.get_num_threads()
    env = dict(os.environ)
    yield
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(env)


def test_thread_env() -> None:
    env = thread_env(3)
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["MKL_NUM_THREADS"] == "3"
    assert env["OPENBLAS_NUM_THREADS"] == "3"
    with pytest.raises(ValueError):
        thread_env(0)


@pytest.mark.usefixtures("restore_process")
def test_pin_current_process() -> None:
    cpu = allowed_cpus()[-1]
    pin_current_process([cpu], threads=1)
    assert os.sched_getaffinity(0) == {cpu}
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"


@pytest.mark.usefixtures("restore_process")
def test_pin_tolerates_interop_already_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(n: int) -> None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work")

    monkeypatch.setattr(torch, "get_num_interop_threads", lambda: 4)
    monkeypatch.setattr(torch, "set_num_interop_threads", refuse)
    with caplog.at_level(logging.INFO, logger="packrat.runtime.pinning"):
        pin_current_process(allowed_cpus(), threads=1)
    assert "inter-op threads stay at 4" in caplog.text
    assert torch.get_num_threads() == 1


def test_pin_rejects_empty() -> None:
    with pytest.raises(ValueError):
        pin_current_process([], threads=1)


def test_the_reader_gets_a_core_only_where_one_is_spare() -> None:
    assert reader_split([0, 1], 1) == (frozenset({0}), frozenset({1}))
    assert reader_split({4, 2, 7, 5}, 2) == (frozenset({2, 4, 5}), frozenset({7}))
    assert reader_split([0, 1], 2) is None  # every core computes: the reader shares them
    assert reader_split([3], 1) is None
