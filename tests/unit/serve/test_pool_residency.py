"""The pool's residency manager: never over budget with nothing pinned, LRU evicts whole
models least recent first, LCache keeps prefixes and never evicts a running model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.serve.pool.residency import ResidencyManager

SIZES = {"a": [4, 4, 4], "b": [2, 6], "c": [8], "d": [3, 3, 3, 3]}


def _manager(policy: str, budget: int, now: list[float]) -> ResidencyManager:
    shapes = {n: (s, [0.01] * len(s)) for n, s in SIZES.items()}
    return ResidencyManager(
        shapes, budget_bytes=budget, rate_bps=100.0, policy=policy, clock=lambda: now[0]
    )  # type: ignore[arg-type]


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(["lru", "lcache"]),
    st.integers(12, 30),
    st.lists(st.sampled_from(list(SIZES)), min_size=1, max_size=25),
)
def test_within_budget_after_every_request_and_room_made_before_it(policy, budget, seq):  # type: ignore[no-untyped-def]
    now = [0.0]
    m = _manager(policy, budget, now)
    for name in seq:
        now[0] += 1.0
        dropped = m.before(name)
        assert all(n != name for n, _ in dropped)  # the one about to run is never trimmed
        others = sum(sum(SIZES[n][: m.prefix[n]]) for n in SIZES if n != name)
        assert others + sum(SIZES[name]) <= budget  # it fits whole beside the rest
        m.after(name)
        assert m.used() <= budget
        for n, p in m.prefix.items():
            assert 0 <= p <= len(SIZES[n])
            if policy == "lru":
                assert p in (0, len(SIZES[n]))  # whole models only


def test_lru_evicts_the_least_recent_whole_model_tail_first() -> None:
    now = [0.0]
    m = _manager("lru", 20, now)
    for name in ("a", "b"):
        m.before(name)
        m.after(name)
    assert m.before("c") == [("a", 2), ("a", 1), ("a", 0)]
    m.after("c")
    assert m.prefix == {"a": 0, "b": 2, "c": 1, "d": 0}


def test_lcache_trims_a_tail_and_keeps_the_prefix() -> None:
    now = [0.0]
    m = _manager("lcache", 16, now)
    for name in ("a", "a", "a", "d"):
        now[0] += 1
        m.before(name)
        m.after(name)
    # a (asked three times) keeps more of its layers than d; both keep a prefix
    assert m.prefix["a"] >= m.prefix["d"] >= 1
    assert m.used() <= 16


def test_a_running_model_is_never_evicted() -> None:
    now = [0.0]
    m = _manager("lru", 20, now)
    m.before("a")  # a runs...
    dropped = m.before("d")  # ... while d needs room
    assert all(n != "a" for n, _ in dropped)
