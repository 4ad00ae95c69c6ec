"""Pod memory per extra instance, per engine: makes the memory rows of docs/measurements.md's
engines section.

Starts 1, then 2, then 3 pinned 1-thread instances of each engine (fresh profiler workers,
the artefacts of ``engines_bench.py``'s cache), runs one batch in each, and reads every
worker's proportional set size (PSS, /proc/<pid>/smaps_rollup: shared pages counted once
across the workers that map them) and how much of it is mapped from the artefact's files.
The growth per extra instance is what a pod pays for one more thin instance of that engine.

    .venv/bin/python benchmarks/engines/engine_memory.py --model resnet50 \
        --out benchmarks/results/engines/memory-resnet50.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engines_bench import engine_worker  # noqa: E402

from packrat.profiler.engines import prepare_engine  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Which engine should each thin instance run: eager, ONNX Runtime or'
    " OpenVINO, against fat and OpenVINO's own hints?\""
    ', part "the memory per extra instance"'
    " (#which-engine-should-a-thin-instance-run-against-fat-and-openvinos-own-hints)"
)


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--engines", default="eager,onnxruntime,openvino")
    parser.add_argument("--max-instances", type=int, default=3)
    parser.add_argument("--artefacts", type=Path, default=Path("/tmp/packrat-artefacts"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: dict[str, Any] = {"model": args.model, "engines": {}}
    for engine in args.engines.split(","):
        path = None
        if engine != "eager":
            record = prepare_engine(args.model, engine, args.artefacts, threads=1)
            if record["status"] != "ok":
                print(f"{engine}: left out: {record['reason']}")
                continue
            path = record["artefact"]["path"]
        workers = []
        rows = []
        try:
            for n in range(1, args.max_instances + 1):
                workers.append(engine_worker(args.model, engine, path, [0]))
                for w in workers:
                    w.send(1)
                    w.recv()
                total = sum(pss_kib(w.p.pid) for w in workers)
                rows.append({"instances": n, "pss_mib": round(total / 1024, 1)})
        finally:
            for w in workers:
                w.close()
        steps = [round(b["pss_mib"] - a["pss_mib"], 1) for a, b in itertools.pairwise(rows)]
        out["engines"][engine] = {"rows": rows, "per_extra_instance_mib": steps}
        print(f"{engine}: PSS {[r['pss_mib'] for r in rows]} MiB; per extra instance {steps}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
