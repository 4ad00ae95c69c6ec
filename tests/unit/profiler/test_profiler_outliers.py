"""Suspect points: monotonicity breaks and spikes, judged against each point's noise."""

from __future__ import annotations

from packrat.plan.profile import ProfilePoint
from packrat.profiler.outliers import better_point, find_suspects, noise


def _points(rows: dict[int, list[float]], *, cv: float = 0.01, n: int = 20) -> dict:
    out = {}
    for t, latencies in rows.items():
        for i, value in enumerate(latencies):
            b = 2**i
            out[(t, b)] = ProfilePoint(threads=t, batch=b, latency_ms=value, samples=n, cv=cv)
    return out


def test_a_clean_profile_has_no_suspects() -> None:
    points = _points({1: [10, 19, 37, 75, 150], 2: [6, 11, 20, 40, 80]})
    assert find_suspects(points) == []


def test_the_issue_case_batch8_above_batch16_is_flagged() -> None:
    # the busy-machine profile from issue 11: fat batch 8 took 5268 ms, batch 16 4890 ms
    points = _points({2: [700, 1300, 2600, 5268, 4890]})
    suspects = find_suspects(points)
    assert [(s.key, s.rule) for s in suspects] == [((2, 8), "non-monotone")]
    assert suspects[0].blocking
    assert "5268.00 ms" in suspects[0].detail


def test_a_spike_above_its_neighbours_is_flagged_but_not_blocking() -> None:
    points = _points({1: [10, 30, 40, 80]})  # b=2 is 30 ms, neighbours' mean 25 ms
    suspects = find_suspects(points)
    assert [(s.key, s.rule, s.blocking) for s in suspects] == [((1, 2), "batch-spike", False)]


def test_thread_spike() -> None:
    points = _points({1: [10], 2: [20], 3: [8]})
    assert [(s.key, s.rule) for s in find_suspects(points)] == [((2, 1), "thread-spike")]


def test_noise_widens_the_allowance() -> None:
    # 8% non-monotone: flagged with tight samples, not with noisy few samples
    tight = _points({1: [10, 20, 43, 40]}, cv=0.01, n=50)
    noisy = _points({1: [10, 20, 43, 40]}, cv=0.2, n=5)
    assert [s.key for s in find_suspects(tight)] == [(1, 4)]
    assert find_suspects(noisy) == []
    assert noise(tight[(1, 4)], tight[(1, 8)]) == 0.05


def test_better_point_keeps_the_lower_mean() -> None:
    a = ProfilePoint(threads=1, batch=1, latency_ms=12.0)
    b = ProfilePoint(threads=1, batch=1, latency_ms=10.0)
    assert better_point(a, b) is b and better_point(b, a) is b
