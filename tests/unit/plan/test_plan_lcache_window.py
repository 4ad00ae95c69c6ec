"""The reader's window in bytes (plan.lcache.pipeline_latency with ``window_bytes``) against a
brute-force event simulation of a reader and a compute stream, and its two limits: a window
of 0 is one layer ahead, a window holding the model is unbounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrat.plan.pool.lcache import ModelLayers, cold_latency, latency_curve, pipeline_latency


def simulate(copy: list[float], compute: list[float], size: list[int], window: int) -> float:
    """Step the two actors: compute runs layer by layer, waiting at a layer until it is in;
    whenever compute waits, the reader brings its next layer, starting at the first moment
    (its own free time, or a layer's start) at which the layers read and not yet started,
    with this one, fit the window or none are ahead."""
    n = len(copy)
    start: list[float] = []  # when compute reached each layer
    ready: dict[int, float] = {i: 0.0 for i in range(n) if copy[i] <= 0}
    reader_free, t = 0.0, 0.0
    todo = [i for i in range(n) if copy[i] > 0]
    for i in range(n):
        start.append(t)
        while i not in ready:  # compute waits: the reader brings its next layer
            r = todo.pop(0)
            for moment in sorted({reader_free, *(s for s in start if s >= reader_free)}):
                ahead = sum(
                    size[j]
                    for j in ready
                    if copy[j] > 0 and j < r and start_after(start, j, moment)
                )
                if ahead == 0 or ahead + size[r] <= window:
                    break
            else:
                moment = max(start)  # unreachable: at the latest start nothing is ahead
            reader_free = moment + copy[r]
            ready[r] = reader_free
        t = max(t, ready[i]) + compute[i]
    return t


def start_after(start: list[float], j: int, moment: float) -> bool:
    """Layer ``j`` has not started at ``moment``."""
    return j >= len(start) or start[j] > moment


layer = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]),  # copy s (0: resident)
    st.sampled_from([0.0, 0.25, 1.0, 2.0]),  # compute s
    st.integers(1, 6),  # bytes
)


@given(st.lists(layer, max_size=9), st.integers(0, 14))
def test_the_window_recurrence_is_the_simulated_pipeline(
    layers: list[tuple[float, float, int]], window: int
) -> None:
    copy = [c for c, _, _ in layers]
    compute = [x for _, x, _ in layers]
    size = [b for _, _, b in layers]
    got = pipeline_latency(copy, compute, window_bytes=window, layer_bytes=size)
    assert got == pytest.approx(simulate(copy, compute, size, window))


@given(st.lists(layer, min_size=1, max_size=9))
def test_window_limits_are_one_layer_ahead_and_unbounded(
    layers: list[tuple[float, float, int]],
) -> None:
    copy = [c or 1.0 for c, _, _ in layers]  # every layer brought
    compute = [x for _, x, _ in layers]
    size = [b for _, _, b in layers]
    one = pipeline_latency(copy, compute, window_bytes=0, layer_bytes=size)
    assert one == pytest.approx(pipeline_latency(copy, compute, lookahead=1))
    whole = pipeline_latency(copy, compute, window_bytes=sum(size), layer_bytes=size)
    assert whole == pytest.approx(pipeline_latency(copy, compute))
    assert whole <= one + 1e-9


def test_a_window_lets_small_early_layers_not_starve_the_reader() -> None:
    # ResNet's shape: light, compute-heavy layers first, heavy, cheap ones last
    model = ModelLayers("r", (1, 1, 1, 8, 8), (1.0, 1.0, 1.0, 0.5, 0.5), 1.0)
    one = cold_latency(model, 0, 6.0, lookahead=1)
    windowed = cold_latency(model, 0, 6.0, window_bytes=16)
    assert windowed < one
    curve = latency_curve(model, 6.0, window_bytes=16)
    assert curve.latency_s[0] == windowed and curve.latency_s[-1] == pytest.approx(4.0)


def test_a_window_needs_the_layer_sizes() -> None:
    with pytest.raises(ValueError, match="layer_bytes"):
        pipeline_latency([1.0], [1.0], window_bytes=4)
    with pytest.raises(ValueError, match="no lookahead"):
        pipeline_latency([1.0], [1.0], window_bytes=4, layer_bytes=[1], lookahead=1)
