"""Cold starts from the layer file: every mode computes the warm answer, reads exactly the
layers that were not resident (measured with mincore), in forward order, and leaves the model
resident; the prefetching reader never runs more than its window ahead, on its own core; an
embedding read in place asks for the rows it looks up, all at once, and no others."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from packrat.runtime import layerfile
from packrat.runtime.layerfile import LayerFile
from packrat.runtime.pipelined import MODES, LayeredModel, embedding_layers, layer_times


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.blocks = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.blocks(self.embed(ids).mean(1))
        return out


@pytest.fixture
def lm(tmp_path: Path) -> LayeredModel:
    torch.manual_seed(0)
    path = layerfile.write_layer_file(
        Net().eval(),
        tmp_path / "n.layers",
        spec="net",
        example=torch.zeros(1, 8, dtype=torch.long),
        min_layer_bytes=0,
    )
    lf = LayerFile(path)
    return LayeredModel(layerfile.build_mapped(Net, lf), lf)


X = torch.arange(16).reshape(2, 8)


@pytest.mark.parametrize("mode", MODES)
def test_a_cold_run_reads_the_missing_layers_and_answers_as_warm(
    lm: LayeredModel, mode: str
) -> None:
    warm, _ = lm(X, "load")
    lm.lf.evict_all()
    lm.lf.read_layer(0)  # a resident prefix of one layer
    got, stats = lm(X, mode)  # type: ignore[arg-type]
    assert torch.equal(got, warm)
    assert stats.missing_layers == len(lm.lf.layers) - 1
    assert stats.read_bytes == sum(la.length for la in lm.lf.layers[1:])
    assert lm.missing() == [False] * len(lm.lf.layers)
    _, again = lm(X, mode)  # type: ignore[arg-type]
    assert again.missing_layers == 0 and again.read_bytes == 0


@pytest.mark.parametrize("window", [0, 45_000, 1 << 30])  # layers of 20 KiB: 0, 2, all
def test_prefetch_reads_in_forward_order_within_its_window_on_its_core(
    lm: LayeredModel, window: int
) -> None:
    events: list[tuple[str, int]] = []
    cores: set[frozenset[int]] = set()
    read = lm.lf.read_layer
    size = [la.length for la in lm.lf.layers]

    def traced(i: int, limiter: layerfile.RateLimiter | None = None) -> int:
        events.append(("read", i))
        cores.add(frozenset(os.sched_getaffinity(0)))  # the reader thread's own
        return read(i, limiter)

    lm.lf.read_layer = traced  # type: ignore[method-assign]
    for i, la in enumerate(lm.lf.layers):
        lm.model.get_submodule(la.name).register_forward_pre_hook(
            lambda _m, _a, i=i: events.append(("run", i)), prepend=True
        )
    reader_core = max(os.sched_getaffinity(0))
    lm.reader_cpus = frozenset({reader_core})
    lm.lf.evict_all()
    lm(X, "prefetch", read_ahead_bytes=window)
    reads = [i for kind, i in events if kind == "read"]
    assert reads == list(range(len(lm.lf.layers)))
    assert cores == {frozenset({reader_core})}
    for k, (kind, i) in enumerate(events):
        if kind == "read":  # what was read and had not started, with this layer, fits
            started = {j for e, j in events[:k] if e == "run"}
            ahead = [j for e, j in events[:k] if e == "read" and j not in started]
            assert not ahead or sum(size[j] for j in ahead) + size[i] <= window
    if window == 0:  # one layer ahead: layer i is read only once layer i-1 has started
        assert all(("run", i - 1) in events[: events.index(("read", i))] for i in reads[1:])


def test_embeddings_are_read_in_place_and_layer_times_cover_every_layer(
    lm: LayeredModel,
) -> None:
    in_place = embedding_layers(lm.model, lm.lf)
    assert in_place == {0}
    lm.in_place = in_place
    lm.lf.evict_all()
    _, stats = lm(X, "prefetch")
    assert stats.read_bytes == sum(la.length for la in lm.lf.layers[1:])
    assert lm.lf.resident(0) < lm.lf.layers[0].length  # only the rows looked up
    times = layer_times(lm, X, reps=2)
    assert len(times) == len(lm.lf.layers) and all(t > 0 for t in times)


def test_an_in_place_lookup_asks_for_its_rows_at_once_and_no_others(lm: LayeredModel) -> None:
    lf = lm.lf
    (table,) = lf.layers[0].tensors
    row = table.nbytes // table.shape[0]  # 256 bytes: 16 rows a page
    lf.evict_all()
    asked = lf.prefetch_rows(0, [0, 1, 900, 5000, -1])  # two pages; out of range ignored
    assert asked == 2 * layerfile.PAGE
    deadline = time.monotonic() + 30
    while lf.resident(0) < asked and time.monotonic() < deadline:
        time.sleep(0.01)  # the reads are asynchronous (WILLNEED): wait for them, bounded
    assert lf.resident(0) == asked  # those pages and no read-around
    lm.in_place = frozenset({0})
    lf.evict_all()
    _, stats = lm(X, "prefetch")  # rows 0..15: one page
    assert stats.row_bytes == layerfile.PAGE
    assert row * 16 == layerfile.PAGE  # so X's rows 0..15 are that one page
