"""Layout 2 of the layer file: modules holding tensors (a module without any of its own opened
into its children), grouped in forward order into layers of at least ``min_layer_bytes``, an
embedding table alone; a layout-1 file (one layer per block, no ``layout`` key) still reads,
serves, and is rewritten once into layout 2 with the same weights."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from packrat.runtime import layerfile, zoo
from packrat.runtime.layerfile import LayerFile, group_units
from packrat.runtime.pipelined import LayeredModel, embedding_layers
from packrat.serve.pool.host import Pool, load_config


class Block(nn.Module):
    """No tensors of its own: opened into ``a``, ``norm``, ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.norm = nn.LayerNorm(256)
        self.b = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.b(self.norm(self.a(x)))
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(256, 10)
        self.embed = nn.Embedding(100, 64)
        self.stem = nn.Linear(64, 256)
        self.blocks = nn.Sequential(Block(), Block(), Block())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.stem(self.embed(ids).mean(1))))
        return out


X = torch.arange(12).reshape(2, 6)
UNITS = ["embed", "stem"] + [f"blocks.{b}.{m}" for b in range(3) for m in ("a", "norm", "b")]
UNITS += ["head"]


def _write(tmp_path: Path, name: str, **kw: object) -> tuple[nn.Module, LayerFile]:
    torch.manual_seed(5)
    model = Net().eval()
    path = layerfile.write_layer_file(model, tmp_path / name, spec="net", example=X, **kw)  # type: ignore[arg-type]
    return model, LayerFile(path)


def _answer(lf: LayerFile) -> torch.Tensor:
    lm = LayeredModel(layerfile.build_mapped(Net, lf), lf)
    lf.evict_all()
    return lm(X, "prefetch")[0]


def test_modules_without_tensors_of_their_own_are_opened(tmp_path: Path) -> None:
    model, lf = _write(tmp_path, "fine.layers", min_layer_bytes=0)
    assert lf.layout == layerfile.LAYOUT
    assert [la.name for la in lf.layers] == UNITS
    assert all(la.modules == (la.name,) for la in lf.layers)
    with torch.inference_mode():
        assert torch.equal(_answer(lf), model(X))


def test_small_modules_are_grouped_and_an_embedding_stays_alone(tmp_path: Path) -> None:
    model, lf = _write(tmp_path, "grouped.layers", min_layer_bytes=600_000)
    modules = [m for la in lf.layers for m in la.modules]
    assert modules == UNITS
    assert lf.layers[0].modules == ("embed",)
    assert embedding_layers(LayeredModel(layerfile.build_mapped(Net, lf), lf).model, lf) == {0}
    sizes = [sum(t.nbytes for t in la.tensors) for la in lf.layers]
    assert all(s >= 600_000 for s in sizes[1:-1]) and len(lf.layers) < len(UNITS)
    assert all(la.name == la.modules[0] for la in lf.layers)
    with torch.inference_mode():
        assert torch.equal(_answer(lf), model(X))


def _as_layout_1(path: Path) -> None:
    """Rewrite the header as layout 1 wrote it: no ``layout``, no ``modules``."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[8:16])
    doc = json.loads(raw[16 : 16 + length])
    del doc["layout"]
    for la in doc["layers"]:
        del la["modules"]
    header = json.dumps(doc).encode()
    assert 16 + len(header) <= doc["layers"][0]["offset"]
    body = bytearray(raw)
    body[: 16 + length] = bytes(16 + length)
    body[: 16 + len(header)] = layerfile.MAGIC + struct.pack("<Q", len(header)) + header
    path.write_bytes(bytes(body))


def test_a_layout_1_file_still_serves_and_is_rewritten_once(tmp_path: Path) -> None:
    model, old = _write(tmp_path, "old.layers", group_key=lambda u: u.rsplit(".", 1)[0])
    blocks = [la.name for la in old.layers]
    old.close()
    _as_layout_1(old.path)
    lf = LayerFile(old.path)
    assert lf.layout == 1 and [la.modules for la in lf.layers] == [(n,) for n in blocks]
    with torch.inference_mode():
        want = model(X)
    assert torch.equal(_answer(lf), want)  # gated on each layer's first module
    new = layerfile.upgrade_layer_file(Net, lf, X)
    assert new.layout == layerfile.LAYOUT and len(new.layers) < len(blocks)  # 1 MiB layers
    assert torch.equal(_answer(new), want)
    assert layerfile.upgrade_layer_file(Net, new, X) is new  # current: left as it is


@given(
    st.lists(st.tuples(st.integers(0, 9), st.booleans()), max_size=12),
    st.integers(0, 20),
)
def test_grouping_keeps_order_sizes_and_lone_units(units: list[tuple[int, bool]], mn: int) -> None:
    names = [f"u{i}" for i in range(len(units))]
    sizes = [s for s, _ in units]
    alone = [a for _, a in units]
    groups = group_units(names, sizes, alone, mn)
    assert [u for g in groups for u in g] == names
    size = dict(zip(names, sizes, strict=True))
    lone = dict(zip(names, alone, strict=True))
    for k, g in enumerate(groups):
        if any(lone[u] for u in g):
            assert len(g) == 1
            continue
        closed_by = k + 1 < len(groups) and not any(lone[u] for u in groups[k + 1])
        if closed_by:  # closed because it was full: every prefix but the whole was short
            assert sum(size[u] for u in g) >= mn
        assert all(sum(size[u] for u in g[:j]) < mn for j in range(1, len(g)))


def test_the_writer_refuses_a_root_with_tensors() -> None:
    with pytest.raises(layerfile.LayerFileError, match="root"):
        layerfile.forward_units(nn.Linear(2, 2), torch.zeros(1, 2))


def test_the_pool_rewrites_a_layout_1_file_at_start_and_pins_its_reader(tmp_path: Path) -> None:
    model = zoo.load_model("tiny", seed=1)
    x = zoo.example_input("tiny", 2)
    path = layerfile.write_layer_file(
        model, tmp_path / "a.layers", spec="tiny", example=x, group_key=lambda u: u
    )
    _as_layout_1(path)
    assert LayerFile(path).layout == 1
    doc = {"directory": str(tmp_path), "budget_bytes": 1 << 24, "read_ahead_bytes": 4096}
    pool = Pool(load_config({**doc, "models": [{"name": "a", "spec": "tiny", "seed": 1}]}))
    lm = pool.models["a"].lm
    assert lm.lf.layout == layerfile.LAYOUT and LayerFile(path).layout == layerfile.LAYOUT
    assert lm.read_ahead_bytes == 4096
    cores = sorted(os.sched_getaffinity(0))
    assert lm.reader_cpus == (frozenset(cores[-1:]) if len(cores) > 1 else None)
    seen: list[set[int]] = []

    def compute_thread() -> None:
        pool.pin_compute_thread()
        seen.append(os.sched_getaffinity(0))

    worker = threading.Thread(target=compute_thread)
    worker.start()
    worker.join()
    assert seen == [set(cores[:-1]) if len(cores) > 1 else set(cores)]
    lm.lf.evict_all()
    with torch.inference_mode():
        assert torch.equal(lm(x, "prefetch")[0], model(x))
