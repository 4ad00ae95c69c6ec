"""What the native runtime's worker adds to a batch beyond the model (issue 25): decoding each
request's raw body, stacking the batch and encoding each answer row
(:class:`packrat.serve.modelservice.ModelService`, what a native worker runs) against the
model called on a ready tensor (what the profiler's forked workers time). One thread, the
two interleaved, medians after a warm-up pass; a small gap means the profile the optimizer
plans from is what the native runtime serves.

    python benchmarks/serving/service_overhead.py --model resnet50 --batch 1,8 --repeats 10 \\
        --out benchmarks/results/native-service-overhead-resnet50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from packrat.runtime import modelid, zoo
from packrat.serve.codec import example_body
from packrat.serve.modelservice import BatchContext, ModelService

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Native runtime or TorchServe?"'
    " (#native-runtime-or-torchserve)"
)


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    service = ModelService(
        {"spec": args.model, "inputs": modelid.zoo_input_spec(args.model)}, Path("."), None
    )
    body = example_body(args.model)
    out: dict[str, Any] = {"model": args.model, "batches": {}, "command": " ".join(sys.argv)}
    for b in (int(x) for x in args.batch.split(",")):
        x = zoo.example_input(args.model, b)
        model_ms, service_ms = [], []
        for _ in range(args.repeats + 1):  # the first pass of each warms up, not counted
            start = time.perf_counter()
            with torch.inference_mode():
                service.model(*x) if isinstance(x, tuple) else service.model(x)
            model_ms.append(1000 * (time.perf_counter() - start))
            start = time.perf_counter()
            service.handle([{"body": body} for _ in range(b)], BatchContext(b))
            service_ms.append(1000 * (time.perf_counter() - start))
        m, s = statistics.median(model_ms[1:]), statistics.median(service_ms[1:])
        out["batches"][str(b)] = {
            "model_ms": m, "service_ms": s, "service_over_model": s / m,
            "model_all_ms": model_ms[1:], "service_all_ms": service_ms[1:],
        }  # fmt: skip
        print(f"B={b}: model {m:.2f} ms, through the service {s:.2f} ms ({s / m:.3f}x)")
    Path(args.out + ".json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
