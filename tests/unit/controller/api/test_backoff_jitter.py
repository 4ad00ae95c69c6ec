"""The operator's one backoff (``api/backoff.py``): doubling, capped, jittered, stable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from packrat.controller.api.backoff import SPREAD, backoff, jitter

attempts = st.integers(min_value=1, max_value=60)
bases = st.floats(min_value=0.01, max_value=100.0)
caps = st.floats(min_value=0.01, max_value=1e4)


@given(attempts, bases, caps, st.text(max_size=20))
def test_the_delay_doubles_up_to_the_cap_less_the_jitter(
    attempt: int, base: float, cap: float, seed: str
) -> None:
    plain = min(base * 2.0 ** (attempt - 1), cap)
    delay = backoff(attempt, base=base, cap=cap, seed=seed)
    assert plain * (1 - SPREAD) <= delay <= plain <= cap
    assert delay == backoff(attempt, base=base, cap=cap, seed=seed)  # stable per seed


def test_objects_that_failed_together_come_back_apart() -> None:
    delays = {backoff(3, base=2.0, cap=60.0, seed=f"ns/model-{i}") for i in range(100)}
    assert len(delays) > 90
    assert max(delays) - min(delays) > 0.5 * SPREAD * 8.0  # spread over most of the range
    assert all(0.0 <= jitter(f"m{i}", 1) < 1.0 for i in range(100))
