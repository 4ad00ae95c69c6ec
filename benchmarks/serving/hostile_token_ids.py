"""What one request with out-of-range token ids costs the good requests batched with it.

A serving
worker's ModelService (the one both runtimes run) handles batches of BERT-base requests,
``--batch`` of them, one of which holds an id past the vocabulary (30522). Before the fix
(``--before TREE``: an older checkout's ``operator/``), that id reached the embedding, failed
the whole batch and the handler ran every request again alone; after, the codec refuses it
as the request's own 400 and the rest run as one batch. Variants run in alternating
processes (A B A B ...); each prints the seconds of every batch and the statuses; the
summary is the median batch time per variant and their ratio, with a clean batch's time.

    flock /tmp/packrat-bench.lock python benchmarks/serving/hostile_token_ids.py \
        --before /tmp/base --rounds 2 --reps 3 \
        -o benchmarks/results/serving/token-ids-out-of-range.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "What does a request with token ids out of range cost the requests batched with it?"'
    " (#what-does-a-request-with-token-ids-out-of-range-cost-the-requests-batched-with-it)"
)

INNER = r"""
import json, sys, time, torch
from pathlib import Path
from packrat.runtime import zoo
from packrat.serve import codec
from packrat.serve.modelservice import BatchContext, ModelService
batch, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
spec = {"spec": "bert-base", "inputs": zoo.input_spec("bert-base")}
service = ModelService(spec, Path("."), None)
good = codec.example_body("bert-base")
bad = json.dumps([30522] + [0] * 127).encode()
out = {"attacked": [], "clean": [], "statuses": None}
for _ in range(reps):
    for kind, rows in (("clean", [good] * batch), ("attacked", [good] * (batch - 1) + [bad])):
        context = BatchContext(len(rows))
        start = time.perf_counter()
        service.handle([{"body": r} for r in rows], context)
        out[kind].append(time.perf_counter() - start)
        if kind == "attacked":
            out["statuses"] = context.statuses
print(json.dumps(out))
"""


def _run(tree: Path, batch: int, reps: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree / "operator")}
    done = subprocess.run(
        [sys.executable, "-c", INNER, str(batch), str(reps)],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--before", type=Path, required=True, help="a checkout before the fix")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs of processes")
    parser.add_argument("--reps", type=int, default=3, help="batches of each kind per process")
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", HERE)):
            runs[name].append(_run(tree, args.batch, args.reps))
            print(name, json.dumps(runs[name][-1]), flush=True)
    summary = {}
    for name, results in runs.items():
        attacked = [t for r in results for t in r["attacked"]]  # type: ignore[attr-defined]
        clean = [t for r in results for t in r["clean"]]  # type: ignore[attr-defined]
        summary[name] = {
            "attacked_median_s": statistics.median(attacked),
            "attacked_range_s": [min(attacked), max(attacked)],
            "clean_median_s": statistics.median(clean),
            "statuses": results[-1]["statuses"],
        }
    ratio = summary["before"]["attacked_median_s"] / summary["after"]["attacked_median_s"]
    report = {"batch": args.batch, "summary": summary, "before_over_after": ratio, "runs": runs}
    print(json.dumps({k: report[k] for k in ("batch", "summary", "before_over_after")}, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
