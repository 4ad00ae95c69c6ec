"""The discrete-event simulation's speed against an earlier revision's, side by side.

Run: ``.venv/bin/python benchmarks/optimizer/des_speed.py --base REV`` (from the repository
root). Loads ``operator/packrat/plan/des.py`` as it was at ``REV`` (``git show``) beside this
tree's, checks that both give the same latencies (and prints their hash) on four
configurations (one instance per replica, four mixed instances, an overloaded replica that
queues and sheds, no batching delay), then times both, interleaved (A B B A ...), as this
process's CPU time (the machine is shared: CPU time is less disturbed by other work than
wall time). Prints the medians, the new/old ratio's median and range per configuration,
and the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from packrat.plan import des

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How fast is the simulation after its split into named steps?"'
    " (#how-fast-is-the-simulation-after-its-split-into-named-steps)"
)

ROOT = Path(__file__).resolve().parents[2]
TABLE = {(t, b): (2.0 + 8.0 * b**0.8) / t**0.7 for t in (1, 2, 4, 8) for b in (1, 2, 4, 8, 16, 32)}
CONFIGS: dict[str, dict[str, Any]] = {
    "one instance b8": {"instances": [(4, 8)], "replicas": 2, "rate": 700.0, "cv": 0.3},
    "four mixed": {
        "instances": [(1, 1), (1, 2), (2, 4), (4, 8)],
        "replicas": 2,
        "rate": 900.0,
        "cv": 0.2,
    },
    "overloaded": {"instances": [(2, 2), (2, 4)], "replicas": 1, "rate": 1200.0, "cv": 0.0},
    "no delay": {
        "instances": [(1, 4), (1, 4)],
        "replicas": 3,
        "rate": 800.0,
        "cv": 0.1,
        "delay": 0.0,
    },
}


def load_revision(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:operator/packrat/plan/des.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "des_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("des_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["des_base"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def simulate(module: ModuleType, name: str, arrivals: np.ndarray) -> np.ndarray:
    c = CONFIGS[name]
    result = module.simulate(
        arrivals,
        TABLE,
        c["instances"],
        replicas=c["replicas"],
        service_cv=c["cv"],
        max_batch_delay_ms=c.get("delay", 5.0),
        queue_limit=200,
        seed=3,
    )
    latencies: np.ndarray = result.latencies_ms
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--arrivals", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    base = load_revision(args.base)
    rng = np.random.default_rng(0)
    arrivals = {
        name: np.cumsum(rng.exponential(1.0 / c["rate"], args.arrivals))
        for name, c in CONFIGS.items()
    }
    for name in CONFIGS:
        old, new = simulate(base, name, arrivals[name]), simulate(des, name, arrivals[name])
        if not np.array_equal(old, new):
            print(f"{name}: the latencies differ", file=sys.stderr)
            return 1
        shed = int(np.sum(~np.isfinite(new)))
        digest = hashlib.sha256(new.tobytes()).hexdigest()[:16]
        print(f"{name}: identical latencies ({shed} shed, sha256 {digest})")
    seconds: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for name in CONFIGS:
            pair = [("base", base), ("this", des)]
            for label, module in pair if r % 2 == 0 else pair[::-1]:
                start = time.process_time()
                simulate(module, name, arrivals[name])
                seconds.setdefault((label, name), []).append(time.process_time() - start)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.arrivals} arrivals, {args.repeats} interleaved repeats, CPU time; load {load}")
    for name in CONFIGS:
        old, new = seconds[("base", name)], seconds[("this", name)]
        ratios = [b / a for a, b in zip(old, new, strict=True)]
        print(
            f"{name:16s} base {statistics.median(old) * 1e3:6.1f} ms  "
            f"this {statistics.median(new) * 1e3:6.1f} ms  this/base median "
            f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
