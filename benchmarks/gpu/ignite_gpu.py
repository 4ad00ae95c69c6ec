"""Ignite on one GPU: cold starts with pipelined loading and direct host access, and LCache
against whole-model LRU for a pool of models under a device-memory budget.

Makes the figures of issue 40 (docs/measurements.md, "Ignite on a GPU"):

1. Per model (ResNet-50, BERT-base, the zoo's GPT-2) and batch (1, 8): warm latency (the plain
   model on the device, and the staged model fully resident), and cold latency with the
   weights in pinned host memory: load-then-run (every stage copied, then run), pipelined
   (stage i runs while i+1 is copied), pipelined + direct host access (the per-layer plan of
   packrat.plan.gpu.layerplan: some stages read in place from mapped host memory). Configurations
   interleaved round by round; medians, p10/p90, the plan's predicted latency beside each.
   Warm with the stages read in place even when warm (in_place_always: embeddings) too.
   Targets: pipelined + DHA <= 0.7x load-then-run; staged warm within 5% of plain warm.
2. A pool of N models (default 40, the three kinds in turn, each with its own weights) with a
   device budget for about 8 of them and a Zipf request mix at batch 1: per-request latency
   with LCache (packrat.plan.pool.lcache over the measured GPU curves) and with whole-model LRU
   (ModelMesh: load-then-run; and LRU with pipelined loading), and LCache without direct host
   access (its share of the gain), blocks of requests interleaved
   across the pools. Target: P99 with LCache <= 0.6x LRU's, 0 failed requests, resident bytes
   never above the budget.

Every cold output is checked against the plain model's (mismatches are counted and reported).
Raw results: one JSON file (--out). ``--dry-run`` runs every step on the CPU stand-in with
small models in seconds (CI runs it: tests/integration/test_bench_gpu_dry_run.py).

On the device machine: ``PYTHONPATH=operator python3 benchmarks/gpu/ignite_gpu.py --out
$OUT/ignite_gpu.json`` (about 2-4 minutes on one H100; see benchmarks/gpu/run_on_device.sh).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from packrat.plan.gpu.layerplan import (
    Placement,
    StageProfile,
    best_placement,
    cold_latency,
    in_place_always,
    warm_latency,
)
from packrat.plan.pool.lcache import lru_access
from packrat.runtime.gpu.device import CpuDevice, CudaDevice, Device
from packrat.runtime.gpu.executor import HostWeights, ModelMemory, run_pass
from packrat.runtime.gpu.pool import DevicePool
from packrat.runtime.gpu.profile import profile_stages
from packrat.runtime.gpu.stages import StagedModel, split
from packrat.runtime.zoo import example_input, load_model
from packrat.runtime.zoo.transformer import GPT2, BertBase

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does Ignite gain on a GPU node?"'
    " (#what-does-ignite-gain-on-a-gpu-node)"
)

MODELS = ("resnet50", "bert-base", "gpt2")
COLD = ("load_then_run", "pipelined", "pipelined_dha")


def _small(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "bert-base":
        return BertBase(vocab=512, hidden=32, layers=3, heads=2, ffn=64, max_positions=32).eval()
    if name == "gpt2":
        return GPT2(vocab=512, hidden=32, layers=3, heads=2).eval()
    return load_model("tiny")


@functools.cache
def _model(name: str, dry: bool, copy_no: int = 0) -> nn.Module:
    """The model, built once per name (``copy_no`` 1: a second, independent build)."""
    return _small(name) if dry else load_model(name)


def build(name: str, batch: int, dry: bool) -> tuple[nn.Module, Tensor]:
    """The model (eval, no grad) and a deterministic input of ``batch``."""
    model = _model(name, dry)
    if not dry:
        x = example_input(name, batch)
        assert isinstance(x, Tensor)
        return model, x
    g = torch.Generator().manual_seed(1)
    x = (
        torch.randn(batch, 16, generator=g)
        if name == "resnet50"
        else torch.randint(0, 512, (batch, 16), generator=g)
    )
    return model, x


def timed(dev: Device, fn: Callable[[], Tensor]) -> tuple[float, Tensor]:
    """Wall seconds from an idle device to the output ready (what a request sees)."""
    dev.synchronize()
    t0 = time.perf_counter()
    out = fn()
    dev.synchronize()
    return time.perf_counter() - t0, out


def same(out: Tensor, ref: Tensor) -> bool:
    """Equal up to kernel rounding (TF32 convolutions, another algorithm): a stage that ran
    before its copy landed, or on the wrong weights, is off by far more (or NaN)."""
    a, b = out.float().cpu(), ref.float().cpu()
    return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= 1e-2 * (
        1.0 + float(b.abs().max())
    )


def summary(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {
        "median_ms": float(np.median(a)),
        "p10_ms": float(np.percentile(a, 10)),
        "p90_ms": float(np.percentile(a, 90)),
        "n": len(xs),
    }


def cold_starts(name: str, batch: int, dev: Device, args: argparse.Namespace) -> dict[str, Any]:
    """Part 1 for one model and batch."""
    model, x_cpu = build(name, batch, args.dry_run)
    staged = split(model)
    cold_mem = ModelMemory.pinned(staged, dev)
    warm_mem = cold_mem.sharing_host()
    for i in range(len(staged.stages)):
        warm_mem.put(warm_mem.stage_on_device(i))
    plain = _model(name, args.dry_run, 1).to(dev.torch_device)  # its own build, same weights
    x = dev.to_device(x_cpu)
    with torch.no_grad():
        ref = plain(x)  # the plain model on the same device: the same kernels
    profile = profile_stages(cold_mem, x, repeat=args.profile_repeat)
    n = len(staged.stages)
    loads: tuple[Placement, ...] = ("load",) * n
    fixed = in_place_always(profile)
    dha = best_placement(profile, 0, fixed_host=fixed).placements
    warm_dha: tuple[Placement, ...] = tuple("host" if i in fixed else "resident" for i in range(n))
    configs: dict[str, Callable[[], Tensor]] = {
        "warm_plain": lambda: plain(x),
        "warm_staged": lambda: run_pass(warm_mem, ("resident",) * n, x)[0],
        "warm_dha": lambda: run_pass(warm_mem, warm_dha, x)[0],
        "load_then_run": lambda: run_pass(cold_mem, loads, x, load_first=True)[0],
        "pipelined": lambda: run_pass(cold_mem, loads, x)[0],
        "pipelined_dha": lambda: run_pass(cold_mem, dha, x)[0],
    }
    times: dict[str, list[float]] = {k: [] for k in configs}
    mismatches = 0
    with torch.no_grad():
        for fn in configs.values():  # warm-up: kernels chosen, allocator primed
            fn()
        # warm requests follow warm requests (a warm model's stages stay bound); the cold
        # configurations are interleaved among themselves: A B A B ..., C D E C D E ...
        for group in (("warm_plain", "warm_staged", "warm_dha"), COLD):
            for _ in range(args.rounds):
                for k in group:
                    t, out = timed(dev, configs[k])
                    times[k].append(t)
                    if not same(out, ref):
                        mismatches += 1
    predicted = {
        "warm": warm_latency(profile),
        "load_then_run": sum(s.copy_s for s in profile) + warm_latency(profile),
        "pipelined": cold_latency(profile, loads),
        "pipelined_dha": cold_latency(profile, dha),
    }
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name,
        "batch": batch,
        "stages": n,
        "bytes": staged.total_bytes,
        "dha_placements": list(dha),
        "in_place_when_warm": [staged.stages[i].name for i in sorted(fixed)],
        "latency": {k: summary(v) for k, v in times.items()},
        "predicted_ms": {k: v * 1e3 for k, v in predicted.items()},
        "ratio_dha_vs_load_then_run": med["pipelined_dha"] / med["load_then_run"],
        "ratio_pipelined_vs_load_then_run": med["pipelined"] / med["load_then_run"],
        "ratio_warm_staged_vs_plain": med["warm_staged"] / med["warm_plain"],
        "ratio_warm_dha_vs_plain": med["warm_dha"] / med["warm_plain"],
        "output_mismatches": mismatches,
        "profile": [s.__dict__ for s in profile],
    }


def zipf_rates(n: int, s: float, rng: np.random.Generator) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** s
    return rng.permutation(p / p.sum())


def pool_mix(dev: Device, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: N models, a budget for about B, a Zipf mix; LCache vs whole-model LRU."""
    rng = np.random.default_rng(args.seed)
    kinds = MODELS
    base: dict[str, tuple[StagedModel, Tensor, list[StageProfile], nn.Module]] = {}
    for kind in kinds:
        model, x_cpu = build(kind, 1, args.dry_run)
        staged = split(model)
        mem = ModelMemory.pinned(staged, dev)
        profile = profile_stages(mem, dev.to_device(x_cpu), repeat=args.profile_repeat)
        base[kind] = (staged, x_cpu, profile, model)
        del mem
    names = [f"{kinds[j % len(kinds)]}-{j}" for j in range(args.pool_models)]
    probs = zipf_rates(len(names), args.zipf, rng)
    hosts: dict[str, HostWeights] = {}
    for j, name in enumerate(names):  # each model its own weights, pinned once, shared by the pools
        staged = base[name.rsplit("-", 1)[0]][0]
        scale = 1.0 + 1e-3 * j
        own = {k: t * scale if t.is_floating_point() else t for k, t in staged.tensors.items()}
        hosts[name] = HostWeights.pack(staged, dev, own)
    sizes = {n: hosts[n].total_bytes for n in names}
    budget = int(args.budget_models * float(np.mean(list(sizes.values()))))
    setups = {
        "lcache": ("lcache", "dha"),
        "lcache_pipelined": ("lcache", "pipelined"),  # without direct host access: its share
        "lru_load_then_run": ("lru", "load-then-run"),
        "lru_pipelined": ("lru", "pipelined"),
    }
    pools: dict[str, DevicePool] = {}
    for label, (policy, cold) in setups.items():
        pool = DevicePool(dev, budget, policy=policy, cold=cold)  # type: ignore[arg-type]
        for name, p in zip(names, probs, strict=True):
            kind = name.rsplit("-", 1)[0]
            pool.add(name, base[kind][0], base[kind][2], rate=float(p), host=hosts[name])
        pools[label] = pool
    plan = pools["lcache"].replan()
    pools["lcache_pipelined"].replan()
    inputs = {k: dev.to_device(v[1]) for k, v in base.items()}
    refs: dict[str, Tensor] = {}
    requests = rng.choice(len(names), size=args.requests, p=probs)
    warmup = args.requests // 10
    lat: dict[str, list[float]] = {k: [] for k in pools}
    failures = dict.fromkeys(pools, 0)
    mismatches = dict.fromkeys(pools, 0)
    max_resident = dict.fromkeys(pools, 0)
    block = args.block
    for start in range(0, len(requests), block):  # blocks interleaved across the pools
        for label, pool in pools.items():
            for idx in requests[start : start + block]:
                name = names[int(idx)]
                kind = name.rsplit("-", 1)[0]
                try:
                    t, out = timed(dev, functools.partial(pool.infer, name, inputs[kind]))
                except Exception as exc:  # counted and reported: the figure needs 0
                    failures[label] += 1
                    print(f"{label}: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                if name not in refs:
                    refs[name] = out.float().cpu()
                elif not same(out, refs[name]):
                    mismatches[label] += 1
                max_resident[label] = max(max_resident[label], pool.resident_bytes())
                if start >= warmup:
                    lat[label].append(t)
    out: dict[str, Any] = {
        "models": len(names),
        "budget_bytes": budget,
        "budget_models": args.budget_models,
        "zipf_s": args.zipf,
        "requests": args.requests,
        "counted_from": warmup,
        "lcache_prefixes": plan.prefix,
        "lcache_expected_ms": plan.expected_latency_s * 1e3,
        "predicted": predicted_pool(pools, names, requests[warmup:]),
        "profiles": {k: [s.__dict__ for s in v[2]] for k, v in base.items()},
        "pools": {},
    }
    for label, pool in pools.items():
        a = np.asarray(lat[label]) * 1e3
        out["pools"][label] = {
            "p50_ms": float(np.percentile(a, 50)) if a.size else None,
            "p99_ms": float(np.percentile(a, 99)) if a.size else None,
            "mean_ms": float(a.mean()) if a.size else None,
            "failed": failures[label],
            "output_mismatches": mismatches[label],
            "cold_requests": pool.stats.cold,
            "bytes_copied": pool.stats.bytes_copied,
            "max_resident_bytes": max_resident[label],
            "within_budget": max_resident[label] <= budget,
        }
    p = out["pools"]
    if p["lcache"]["p99_ms"] and p["lru_load_then_run"]["p99_ms"]:
        out["p99_ratio_lcache_vs_lru_load_then_run"] = (
            p["lcache"]["p99_ms"] / p["lru_load_then_run"]["p99_ms"]
        )
        out["p99_ratio_lcache_vs_lru_pipelined"] = (
            p["lcache"]["p99_ms"] / p["lru_pipelined"]["p99_ms"]
        )
    return out


def predicted_pool(
    pools: dict[str, DevicePool], names: list[str], requests: np.ndarray
) -> dict[str, Any]:
    """The pure model's P50/P99 for the same requests (from the measured stage profiles):
    LCache's latency at each model's planned prefix; LRU's hits warm, misses load-then-run."""
    lc = pools["lcache"]
    lcache = [lcache_latency(lc, names[int(i)]) for i in requests]
    lru = pools["lru_load_then_run"]
    resident: tuple[str, ...] = ()
    seen: list[float] = []
    for i in requests:
        e = lru.models[names[int(i)]]
        step = lru_access(resident, lru._sizes, lru.budget_bytes, names[int(i)])
        resident = step.resident
        warm = warm_latency(e.profile)
        seen.append(warm if step.hit else warm + sum(s.copy_s for s in e.profile))
    out = {}
    for label, xs in (("lcache", lcache), ("lru_load_then_run", seen)):
        a = np.asarray(xs) * 1e3
        out[label] = {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}
    return out


def lcache_latency(pool: DevicePool, name: str) -> float:
    e = pool.models[name]
    prefix = e.mem.resident_prefix(e.fixed_host)
    return best_placement(e.profile, prefix, fixed_host=e.fixed_host).latency_s


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, epilog=FIGURE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--dry-run", action="store_true", help="CPU stand-in, small models, few requests (seconds)"
    )
    ap.add_argument(
        "--out", type=Path, help="the raw results (JSON); default benchmarks/results/gpu/"
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument(
        "--rounds", type=int, default=15, help="interleaved rounds per cold-start configuration"
    )
    ap.add_argument("--profile-repeat", type=int, default=5)
    ap.add_argument("--pool-models", type=int, default=40)
    ap.add_argument(
        "--budget-models", type=float, default=8.0, help="device budget in mean model sizes"
    )
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the request mix")
    ap.add_argument("--requests", type=int, default=1500, help="requests per pool configuration")
    ap.add_argument("--block", type=int, default=100, help="requests per interleaved block")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip-pool", action="store_true")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
        args.rounds, args.profile_repeat = min(args.rounds, 2), 1
        args.pool_models, args.budget_models = (
            min(args.pool_models, 6),
            min(args.budget_models, 2.0),
        )
        args.requests, args.block = min(args.requests, 40), min(args.block, 10)
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        ap.error(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "ignite_gpu: CUDA is not available here; use --device cpu or --dry-run", file=sys.stderr
        )
        return 2
    dev: Device = CudaDevice() if args.device == "cuda" else CpuDevice()
    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name()
        if args.device == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "args": {k: str(v) for k, v in vars(args).items()},
        "cold_starts": [],
    }
    out = (
        args.out
        or Path("benchmarks/results/gpu")
        / f"ignite_gpu-{args.device}-{result['when'].replace(':', '')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every section: a run cut short keeps what it measured
        result["wall_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = cold_starts(name, batch, dev, args)
            result["cold_starts"].append(r)
            save()
            med = {k: v["median_ms"] for k, v in r["latency"].items()}
            print(
                f"{name:10s} b={batch}: warm {med['warm_plain']:.2f} / staged "
                f"{med['warm_staged']:.2f} ms; cold load-then-run {med['load_then_run']:.2f}, "
                f"pipelined {med['pipelined']:.2f}, +DHA {med['pipelined_dha']:.2f} ms "
                f"(x{r['ratio_dha_vs_load_then_run']:.2f}); mismatches {r['output_mismatches']}",
                flush=True,
            )
    if not args.skip_pool:
        result["pool"] = pool_mix(dev, args)
        for label, p in result["pool"]["pools"].items():
            print(
                f"pool {label:18s}: P50 {p['p50_ms']:.2f} P99 {p['p99_ms']:.2f} ms, "
                f"failed {p['failed']}, "
                f"cold {p['cold_requests']}, max resident {p['max_resident_bytes'] / 1e9:.2f} GB "
                f"(budget {result['pool']['budget_bytes'] / 1e9:.2f})",
                flush=True,
            )
    save()
    print(f"wrote {out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
