"""The layer file: each layer contiguous and page-aligned, models built from the mapping, and
eviction that really drops the pages (measured with mincore, not assumed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from packrat.runtime import layerfile
from packrat.runtime.layerfile import PAGE, LayerFile, LayerFileError


class Net(nn.Module):
    """Layers whose forward order differs from their definition order."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(256, 10)
        self.blocks = nn.Sequential(*(nn.Linear(256, 256) for _ in range(3)))
        self.act = nn.ReLU()  # no tensors: not a layer
        self.stem = nn.Linear(64, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.act(self.stem(x))))
        return out


def _net() -> nn.Module:
    torch.manual_seed(3)
    return Net().eval()


@pytest.fixture
def written(tmp_path: Path) -> tuple[nn.Module, Path]:
    model = _net()
    path = layerfile.write_layer_file(
        model, tmp_path / "net.layers", spec="net", example=torch.randn(2, 64), min_layer_bytes=0
    )
    return model, path


def test_layers_are_in_forward_order_page_aligned_and_disjoint(
    written: tuple[nn.Module, Path],
) -> None:
    _, path = written
    lf = LayerFile(path)
    assert [la.name for la in lf.layers] == ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]
    end = 0
    for la in lf.layers:
        assert la.offset % layerfile.LAYER_ALIGN == 0 and la.length % PAGE == 0
        assert la.offset >= end
        end = la.offset + la.length
        for t in la.tensors:
            assert t.offset % 64 == 0 and t.offset + t.nbytes <= la.length
    assert os.path.getsize(path) == end
    lf.close()


def test_the_mapped_model_computes_what_the_original_does(
    written: tuple[nn.Module, Path],
) -> None:
    model, path = written
    lf = LayerFile(path)
    mapped = layerfile.build_mapped(Net, lf)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        assert torch.equal(model(x), mapped(x))
    base, end = lf._base, lf._base + os.path.getsize(path)  # every tensor lies in the mapping
    assert all(base <= p.data_ptr() < end for p in mapped.parameters())
    assert not any(p.requires_grad for p in mapped.parameters())


def test_eviction_drops_the_page_cache_and_reading_brings_one_layer_back(
    written: tuple[nn.Module, Path],
) -> None:
    _, path = written
    lf = LayerFile(path)
    lf.evict_all()
    assert lf.resident_layers() == [0] * len(lf.layers)
    assert lf.read_layer(2) == lf.layers[2].length
    got = lf.resident_layers()
    assert got[2] == lf.layers[2].length
    assert sum(got) == got[2]
    lf.evict(2)
    assert lf.resident(2) == 0
    for i in range(len(lf.layers)):  # everything in, then one layer out: exactly that one
        lf.read_layer(i)
    lf.evict(1)
    got = lf.resident_layers()
    assert got[1] == 0
    assert all(got[i] == la.length for i, la in enumerate(lf.layers) if i != 1)


def test_a_forward_pass_faults_every_layer_in(written: tuple[nn.Module, Path]) -> None:
    _, path = written
    lf = LayerFile(path)
    mapped = layerfile.build_mapped(Net, lf)
    lf.evict_all()
    with torch.inference_mode():
        mapped(torch.randn(1, 64))
    assert all(r > 0 for r in lf.resident_layers())
    for i in range(len(lf.layers)):  # mapped and cached: each layer's eviction drops both
        lf.evict(i)
        assert lf.resident(i) == 0
    assert lf.resident_layers() == [0] * len(lf.layers)


def test_a_shared_limiter_counts_every_reader(written: tuple[nn.Module, Path]) -> None:
    _, path = written
    lf = LayerFile(path)
    limiter = layerfile.RateLimiter(1e12)
    total = sum(lf.read_layer(i, limiter) for i in range(len(lf.layers)))
    assert total == lf.total_bytes
    with pytest.raises(ValueError, match="> 0"):
        layerfile.RateLimiter(0)


def test_the_limiter_holds_readers_to_its_rate_and_lets_idle_time_go() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    limiter = layerfile.RateLimiter(100.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):  # reads that take no time: 5 x 100 bytes at 100 B/s
        limiter.wait(100)
    assert now[0] == pytest.approx(5.0)  # 500 bytes at 100 B/s
    now[0] += 10.0  # idle: at most one chunk's time is credited (its own read), no more
    start = now[0]
    limiter.wait(100)
    limiter.wait(100)
    assert now[0] - start == pytest.approx(1.0)


def test_bad_files_are_refused_with_a_reason(
    tmp_path: Path, written: tuple[nn.Module, Path]
) -> None:
    bogus = tmp_path / "bogus.layers"
    bogus.write_bytes(b"not a layer file at all")
    with pytest.raises(LayerFileError, match="not a packrat layer file"):
        LayerFile(bogus)
    _, path = written
    short = tmp_path / "short.layers"
    short.write_bytes(path.read_bytes()[: os.path.getsize(path) - PAGE])
    with pytest.raises(LayerFileError, match="truncated"):
        LayerFile(short)
    with pytest.raises(LayerFileError, match="does not match"):
        layerfile.build_mapped(lambda: nn.Linear(3, 3), LayerFile(path))
    with pytest.raises(LayerFileError, match="cannot open"):
        LayerFile(tmp_path / "missing.layers")


def _big_layer_file(tmp_path: Path) -> LayerFile:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(64, 1024), nn.Linear(1024, 1024)).eval()  # 4 MiB layer
    path = layerfile.write_layer_file(
        model, tmp_path / "big.layers", spec="big", example=torch.randn(1, 64), min_layer_bytes=0
    )
    return LayerFile(path)


def test_a_layer_is_read_in_one_call_that_releases_the_gil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``MADV_POPULATE_READ`` for the whole layer (not one per 1 MiB chunk, each of which
    took the GIL back from the compute thread), its reads queued in pieces no larger than the
    device's readahead window (past it the kernel would fault 4 KiB pages one at a time)."""
    lf = _big_layer_file(tmp_path)
    assert lf._window >= layerfile.MIN_WINDOW
    lf._window = 1 << 20
    populates: list[tuple[int, int]] = []
    willneed: list[tuple[int, int]] = []
    madvise, fadvise = layerfile._madvise, os.posix_fadvise

    def record_madvise(address: int, length: int, advice: int) -> None:
        if advice == layerfile.MADV_POPULATE_READ:
            populates.append((address, length))
        madvise(address, length, advice)

    def record_fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            willneed.append((offset, length))
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(layerfile, "_madvise", record_madvise)
    monkeypatch.setattr(os, "posix_fadvise", record_fadvise)
    lf.evict_all()
    big = lf.layers[1]
    assert big.length >= 4 << 20
    assert lf.read_layer(1) == big.length
    assert lf.resident(1) == big.length
    if not lf._can_populate:
        pytest.skip("this kernel has no MADV_POPULATE_READ (the pread path is tested below)")
    assert [n for _, n in populates] == [big.length]
    assert all(n <= 1 << 20 for _, n in willneed)
    assert sorted(willneed)[0][0] == big.offset
    assert sum(n for _, n in willneed) == big.length
    lf.close()


def test_the_pread_fallback_reads_the_whole_layer(tmp_path: Path) -> None:
    lf = _big_layer_file(tmp_path)
    lf._can_populate = False  # a kernel older than 5.14
    lf.evict_all()
    assert lf.read_layer(1) == lf.layers[1].length
    assert lf.resident(1) == lf.layers[1].length
    lf.close()


def test_the_readahead_window_falls_back_to_the_kernels_default(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert layerfile.MIN_WINDOW <= layerfile.readahead_window(fd) <= 64 << 20
    finally:
        os.close(fd)
