"""Routing: least outstanding work relative to batch size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrat.serve.dispatcher.routing import choose_instance, default_caps


def test_a_burst_fills_each_instance_with_its_batch() -> None:
    batches = [8, 4, 4]
    outstanding = [0, 0, 0]
    for _ in range(sum(batches)):
        i = choose_instance(outstanding, batches)
        assert i is not None
        outstanding[i] += 1
    assert outstanding == batches


def test_ties_prefer_the_larger_batch_then_lower_index() -> None:
    assert choose_instance([0, 0], [2, 4]) == 1
    assert choose_instance([0, 0], [4, 4]) == 0


def test_down_and_full_instances_are_skipped() -> None:
    assert choose_instance([0, 0], [4, 4], up=[False, True]) == 1
    assert choose_instance([0, 8], [4, 4], caps=[0, 8]) is None
    assert choose_instance([0, 0], [4, 4], up=[False, False]) is None


def test_default_caps_are_two_batches() -> None:
    assert default_caps([8, 1]) == [16, 2]


def test_length_mismatch() -> None:
    with pytest.raises(ValueError):
        choose_instance([0], [1, 2])


@given(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=8))
def test_load_stays_proportional(batches: list[int]) -> None:
    outstanding = [0] * len(batches)
    for _ in range(3 * sum(batches)):
        i = choose_instance(outstanding, batches)
        assert i is not None
        outstanding[i] += 1
    ratios = [n / b for n, b in zip(outstanding, batches, strict=True)]
    assert max(ratios) - min(ratios) <= 1.0 + 1e-9
