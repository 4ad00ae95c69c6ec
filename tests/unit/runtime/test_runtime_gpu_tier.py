"""The GPU tier's execution on the CPU stand-in (threads and events for the copy stream): stage
cuts equal the plain models, every placement and schedule gives the plain model's output in
the planned order, the pool holds its budget and evicts from the tail; the same checks on CUDA
where a GPU is present."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from packrat.plan.gpu.layerplan import Op, Placement, lcache_curve
from packrat.runtime.gpu import executor as executor_mod
from packrat.runtime.gpu.device import CpuDevice, CudaDevice, Device
from packrat.runtime.gpu.executor import HostWeights, ModelMemory, run_pass
from packrat.runtime.gpu.pool import DevicePool
from packrat.runtime.gpu.profile import profile_stages
from packrat.runtime.gpu.stages import split
from packrat.runtime.zoo import load_model
from packrat.runtime.zoo.resnet import ResNet50
from packrat.runtime.zoo.transformer import GPT2, BertBase


def small(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "gpt2":  # tied head: the embedding lookup borrows what the head owns
        return GPT2(vocab=64, hidden=16, layers=3, heads=2).eval()
    if kind == "bert":
        return BertBase(vocab=64, hidden=16, layers=2, heads=2, ffn=32, max_positions=16).eval()
    return load_model("tiny")


def ids(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 64, (batch, 8), generator=torch.Generator().manual_seed(1))


def inputs(kind: str) -> torch.Tensor:
    return torch.randn(3, 16) if kind == "tiny" else ids()


@pytest.mark.parametrize("kind", ["tiny", "bert", "gpt2"])
def test_stages_in_order_are_the_plain_model(kind: str) -> None:
    m = small(kind)
    staged = split(m)
    x = inputs(kind)
    with torch.no_grad():
        assert torch.equal(staged.forward(x), m(x))
    assert sum(staged.owned_bytes(i) for i in range(len(staged.stages))) == staged.total_bytes
    # a stage computes with the weights it is handed, not the module's own, and restores them
    nan = {
        k: torch.full_like(t, float("nan")) if t.is_floating_point() else t
        for k, t in staged.tensors.items()
    }
    with torch.no_grad():
        assert torch.isnan(
            staged.stages[-1].run(nan, staged.stages[-2].run(staged.tensors, m_input(staged, x)))
        ).all()
        assert torch.equal(staged.forward(x), m(x))


def test_resnet50_cut_is_the_plain_model_and_owns_every_byte_once() -> None:
    m = load_model("resnet50")
    assert isinstance(m, ResNet50)
    staged = split(m)
    assert [s.name for s in staged.stages][:2] == ["stem", "layer1.0"] and len(staged.stages) == 18
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(staged.forward(x), m(x))
    assert sum(staged.owned_bytes(i) for i in range(18)) == staged.total_bytes


def test_the_tied_embedding_is_owned_by_the_head() -> None:
    staged = split(small("gpt2"))
    assert "embeddings.wte.weight" in staged.stages[-1].owned
    assert "embeddings.wte.weight" not in staged.stages[0].owned


def m_input(staged: Any, x: torch.Tensor) -> torch.Tensor:
    """The activation entering the second-to-last stage."""
    for s in staged.stages[:-2]:
        x = s.run(staged.tensors, x)
    return x


placement_st = st.lists(st.sampled_from(["resident", "load", "host"]), min_size=5, max_size=5)


@settings(max_examples=25, deadline=None)
@given(placement_st, st.one_of(st.none(), st.integers(0, 2)), st.booleans())
def test_every_placement_gives_the_plain_output_in_the_planned_order(
    placements: list[Placement], lookahead: int | None, load_first: bool
) -> None:
    m = small("gpt2")
    x = ids()
    mem = ModelMemory.pinned(split(m), CpuDevice(copy_delay_s_per_byte=2e-8))
    for i, p in enumerate(placements):  # the resident stages' tensors on the "device"
        if p == "resident":
            mem.put(mem.stage_on_device(i))
    log: list[tuple[str, str, int, float]] = []
    lookahead = None if load_first else lookahead
    out, loaded = run_pass(mem, placements, x, lookahead=lookahead, load_first=load_first, log=log)
    with torch.no_grad():
        assert torch.allclose(out, m(x), atol=1e-6)
    at = {(kind, i): t for _, kind, i, t in log}
    copied = [i for i, p in enumerate(placements) if p == "load"]
    assert [i for s, kind, i, _ in log if kind == "copy-start"] == copied  # forward order
    for i in copied:
        assert at[("run-start", i)] >= at[("copy-end", i)]
        if load_first:
            assert at[("run-start", 0)] >= at[("copy-end", copied[-1])]
        if lookahead is not None and i - 1 - lookahead >= 0:
            assert at[("copy-start", i)] >= at[("run-end", i - 1 - lookahead)]
    assert set(loaded) == {k for i in copied for k in mem.staged.stages[i].owned}


def test_a_schedule_without_its_waits_reads_buffers_before_their_copy(monkeypatch: Any) -> None:
    """The check above can fail: drop the waits, and a run reads a buffer the copy has not
    filled yet (NaN on the stand-in)."""

    def no_waits(placements: tuple[Placement, ...], *args: Any) -> tuple[tuple[str, Op], ...]:
        copy = [("copy", Op("copy", i)) for i, p in enumerate(placements) if p == "load"]
        return (*copy, *(("compute", Op("run", i)) for i in range(len(placements))))

    monkeypatch.setattr(executor_mod, "_order", no_waits)
    m = small("bert")
    mem = ModelMemory.pinned(split(m), CpuDevice(copy_delay_s_per_byte=1e-6))
    out, _ = run_pass(mem, ["load"] * len(mem.staged.stages), ids())
    assert torch.isnan(out).any()


def _pool(
    device: Device, budget: int, policy: str, cold: str
) -> tuple[DevicePool, dict[str, nn.Module]]:
    pool = DevicePool(device, budget, policy=policy, cold=cold)  # type: ignore[arg-type]
    models: dict[str, nn.Module] = {}
    for j in range(4):
        m = small("bert" if j % 2 else "gpt2", seed=j)
        staged = split(m)
        mem = ModelMemory.pinned(staged, device)
        profile = profile_stages(mem, device.to_device(ids()), repeat=1)
        pool.add(f"m{j}", staged, profile, rate=[8.0, 4.0, 2.0, 1.0][j])
        models[f"m{j}"] = m
    return pool, models


@pytest.mark.parametrize("cold", ["dha", "pipelined", "load-then-run"])
def test_lcache_pool_holds_its_budget_and_answers_like_the_plain_models(cold: str) -> None:
    device = CpuDevice()
    probe, _ = _pool(device, 0, "lcache", cold)
    one = max(e.mem.packed.total_bytes for e in probe.models.values())
    pool, models = _pool(device, int(1.5 * one), "lcache", cold)
    plan = pool.replan()
    assert pool.resident_bytes() == plan.bytes_used <= pool.budget_bytes
    assert pool.prefixes() == plan.prefix
    x = ids()
    for name in ["m3", "m0", "m1", "m2", "m0"]:
        with torch.no_grad():
            assert torch.allclose(pool.infer(name, x), models[name](x), atol=1e-6)
        assert pool.resident_bytes() <= pool.budget_bytes
    # the hot model loses its rank: replanning trims it from the tail, never from the front
    before = pool.prefixes()
    pool.set_rate("m0", 0.0)
    pool.set_rate("m3", 50.0)
    after = pool.replan().prefix
    assert after["m0"] <= before["m0"] and after["m3"] >= before["m3"]
    mem0 = pool.models["m0"].mem
    owned_front = [k for s in mem0.staged.stages[: after["m0"]] for k in s.owned]
    assert all(k in mem0.resident for k in owned_front) and mem0.resident_prefix() == after["m0"]
    assert pool.resident_bytes() <= pool.budget_bytes


def test_lcache_pool_follows_the_traffic() -> None:
    device = CpuDevice(copy_delay_s_per_byte=1e-7)  # copy-bound: every resident layer pays
    probe, _ = _pool(device, 0, "lcache", "pipelined")
    one = max(e.mem.packed.total_bytes for e in probe.models.values())
    pool, _ = _pool(device, one + one // 50, "lcache", "pipelined")  # margin: the byte grid
    before = pool.replan().prefix
    x = ids()
    for _ in range(20):  # the coldest model becomes the only one asked for
        pool.infer("m3", x)
    rates = pool.rates_from_traffic(1.0, keep=0.0)
    assert rates["m3"] == 20.0 and rates["m0"] == 0.0
    after = pool.replan().prefix
    # m3 gets the shortest prefix with its least latency (its sweet spot at 1.0x warm)
    curve = lcache_curve("m3", 20.0, pool.models["m3"].profile, allow_host=False)
    best = min(curve.latency_s)
    assert curve.latency_s[after["m3"]] == best and after["m3"] >= before["m3"]
    assert all(lat > best for lat in curve.latency_s[: after["m3"]])
    assert after["m0"] <= before["m0"] and pool.resident_bytes() <= pool.budget_bytes


def test_lru_pool_admits_whole_models_and_evicts_the_least_recent() -> None:
    device = CpuDevice()
    probe, _ = _pool(device, 0, "lru", "load-then-run")
    sizes = {n: e.mem.packed.total_bytes for n, e in probe.models.items()}
    pool, models = _pool(
        device, sizes["m0"] + max(sizes["m1"], sizes["m2"]), "lru", "load-then-run"
    )
    x = ids()
    for name in ["m0", "m1", "m0", "m2"]:
        with torch.no_grad():
            assert torch.allclose(pool.infer(name, x), models[name](x), atol=1e-6)
        assert pool.resident_bytes() <= pool.budget_bytes
    full = {n: len(e.profile) for n, e in pool.models.items()}
    assert pool.prefixes()["m0"] == full["m0"] and pool.prefixes()["m1"] == 0  # m1 least recent
    assert pool.stats.requests == 4 and pool.stats.cold == 3


def test_the_profile_measures_every_stage() -> None:
    m = small("bert")
    mem = ModelMemory.pinned(split(m), CpuDevice())
    prof = profile_stages(mem, ids(), repeat=2)
    assert [p.name for p in prof] == [s.name for s in mem.staged.stages]
    assert sum(p.bytes for p in prof) >= mem.staged.total_bytes  # packed, aligned
    assert all(p.exec_s > 0 and p.exec_host_s is not None and p.copy_s > 0 for p in prof)


cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


@cuda
@pytest.mark.parametrize("placement", ["load", "host", "mixed"])
def test_cuda_pass_matches_the_plain_model(placement: str) -> None:
    device = CudaDevice()
    m = small("gpt2")
    mem = ModelMemory.pinned(split(m), device)
    n = len(mem.staged.stages)
    placements: list[Placement] = (
        ["host", *["load"] * (n - 1)] if placement == "mixed" else [placement] * n  # type: ignore[list-item]
    )
    x = ids()
    out, _ = run_pass(mem, placements, x.cuda())
    torch.cuda.synchronize()
    with torch.no_grad():
        assert torch.allclose(out.cpu(), m(x), atol=1e-4)


@cuda
def test_cuda_mapped_host_memory_is_read_in_place() -> None:
    device = CudaDevice()
    host = device.pin(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    view = device.mapped(host)
    assert view.is_cuda and torch.equal(view.cpu(), host)
    host[1, 1] = 100.0  # no copy: the device sees the host's write
    assert float(view[1, 1]) == 100.0


def test_packed_host_weights_hold_every_tensor_once_aligned_per_stage() -> None:
    staged = split(small("gpt2"))
    packed = HostWeights.pack(staged, CpuDevice())
    for k, t in staged.tensors.items():
        stage, offset, nbytes, _, _ = packed.slices[k]
        assert k in staged.stages[stage].owned and offset % 256 == 0
        assert torch.equal(packed.views[k], t)
        flat = packed.flats[stage]
        assert flat is not None and offset + nbytes <= flat.numel()
        # a copy of the stage's buffer gives the same tensor through the same layout
        assert torch.equal(packed.typed(flat.clone(), k), t)
    assert packed.total_bytes >= staged.total_bytes


@cuda
@pytest.mark.parametrize("placement", ["load", "host"])
def test_cuda_runs_wait_for_copies_of_large_stages(placement: str) -> None:
    """Stages of tens of MB: a run that did not wait for its copy would read a buffer still
    being written (the plain model's output is the check)."""
    torch.manual_seed(0)
    m = BertBase(layers=2).eval()
    mem = ModelMemory.pinned(split(m), CudaDevice())
    x = torch.randint(0, 30522, (8, 128))
    with torch.no_grad():
        ref = m(x)
    for _ in range(3):
        out, _ = run_pass(mem, [placement] * len(mem.staged.stages), x.cuda())  # type: ignore[list-item]
        torch.cuda.synchronize()
        assert torch.allclose(out.cpu(), ref, rtol=1e-2, atol=1e-2)


@cuda
@pytest.mark.parametrize("policy", ["lcache", "lru"])
def test_cuda_pool_holds_its_budget_and_frees_what_it_evicts(policy: str) -> None:
    device = CudaDevice()
    cold = "dha" if policy == "lcache" else "load-then-run"
    probe, _ = _pool(device, 0, policy, cold)
    one = max(e.mem.packed.total_bytes for e in probe.models.values())
    pool, models = _pool(device, int(1.5 * one), policy, cold)
    if policy == "lcache":
        pool.replan()
    x = ids()
    for name in ["m0", "m1", "m2", "m3", "m0"]:
        out = pool.infer(name, x.cuda())
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.allclose(out.cpu(), models[name](x), atol=1e-4)
        assert pool.resident_bytes() <= pool.budget_bytes
    before = torch.cuda.memory_allocated()
    held = pool.resident_bytes()
    for e in pool.models.values():
        e.mem.drop()
    torch.cuda.synchronize()
    assert pool.resident_bytes() == 0
    assert torch.cuda.memory_allocated() <= before - held + 1024  # evicted means freed
