"""The coarse-then-refined thread grid (packrat.plan.grid), against the paper's full grids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging_support import ROOT

from packrat.plan.grid import coarse_threads, grid_error, refine_threads, sub_table
from packrat.plan.profile import load_profile

PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"
BATCHES = [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize(
    ("cpus", "threads"),
    [
        (1, [1]),
        (2, [1, 2]),
        (12, [1, 2, 4, 8, 12]),
        (16, [1, 2, 4, 8, 16]),
        (96, [1, 2, 4, 8, 16, 32, 64, 96]),
    ],
)
def test_coarse_threads(cpus: int, threads: list[int]) -> None:
    assert coarse_threads(cpus) == threads


def test_refine_adds_the_midpoints_around_the_chosen_threads() -> None:
    # a table where every plan uses 4-thread instances: the gaps 2..4 and 4..8 get 3 and 6
    table = {
        (t, b): (b + 4.0) / t * (1.0 if t == 4 else 3.0) for t in (1, 2, 4, 8) for b in (1, 2, 4, 8)
    }
    assert refine_threads(table, cpus=8, batches=[1, 2, 4, 8]) == [3, 6]
    again = {**table, **{(t, b): 99.0 for t in (3, 6) for b in (1, 2, 4, 8)}}
    # 3 and 6 lost: a second round halves the gaps around 4 again (3..4 has none, 4..6 has 5)
    assert refine_threads(again, cpus=8, batches=[1, 2, 4, 8]) == [5]


POINTS = st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 4]))


@given(st.dictionaries(POINTS, st.floats(0.5, 50), min_size=1))
def test_grid_error_is_zero_for_the_full_grid_and_never_negative(
    table: dict[tuple[int, int], float],
) -> None:
    cpus = 6
    full = grid_error(table, {t for t, _ in table}, cpus=cpus, batches=[1, 2, 4])
    assert all(v == pytest.approx(0.0) for v in full.values())
    part = grid_error(table, [1, 2, 4], cpus=cpus, batches=[1, 2, 4])
    assert all(v >= -1e-12 for v in part.values())


@pytest.mark.parametrize(
    ("name", "coarse_max", "refined_max"),
    [
        ("resnet-pytorch", 0.0, 0.0),
        ("inception-pytorch", 0.061, 0.0),
        ("bert-pytorch", 0.026, 0.026),
        ("gpt2-pytorch", 0.0, 0.0),
    ],
)
def test_the_papers_16_core_profiles(name: str, coarse_max: float, refined_max: float) -> None:
    """The error stated in docs/measurements.md: 35 coarse points, 56 after one refinement,
    of the full grid's 112, and how much slower the best plan is than with all 16."""
    table = load_profile(PAPER / f"{name}.csv").table()
    coarse = coarse_threads(16)
    more = refine_threads(sub_table(table, coarse), cpus=16, batches=BATCHES)
    refined = sorted({*coarse, *more})
    assert refined == [1, 2, 3, 4, 6, 8, 12, 16]
    assert max(grid_error(table, coarse, cpus=16, batches=BATCHES).values()) <= coarse_max + 1e-9
    assert max(grid_error(table, refined, cpus=16, batches=BATCHES).values()) <= refined_max
