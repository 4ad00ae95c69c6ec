"""OpenVINO with its own stream and thread choice (PERFORMANCE_HINT LATENCY or THROUGHPUT,
automatic NUM_STREAMS) on this process's cores, speaking the profiler worker's protocol
(``{"cmd": "run", "batch": B}`` -> ``{"start", "end"}``): the anchor ``engines_bench.py``
compares the served plan with. The batch is split over OpenVINO's optimal number of infer
requests, run asynchronously, as its THROUGHPUT hint is meant to be used."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "Which engine should each thin instance run: eager, ONNX Runtime or'
    " OpenVINO, against fat and OpenVINO's own hints?\""
    ', part "one OpenVINO hint\'s timings, for engines_bench.py"'
    " (#which-engine-should-a-thin-instance-run-against-fat-and-openvinos-own-hints)"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=FIGURE)
    parser.add_argument("--artefact", required=True, help="OpenVINO IR (model.xml)")
    parser.add_argument("--hint", choices=("LATENCY", "THROUGHPUT"), required=True)
    parser.add_argument("--cpus", required=True)
    parser.add_argument("--inputs", required=True, help="JSON list of {shape, dtype, high}")
    parser.add_argument("--precision", default="f32", help="INFERENCE_PRECISION_HINT or 'auto'")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import openvino as ov

    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    config: dict[str, object] = {"PERFORMANCE_HINT": args.hint}
    if args.precision != "auto":
        config["INFERENCE_PRECISION_HINT"] = args.precision
    compiled = ov.Core().compile_model(args.artefact, "CPU", config)
    nreq = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    requests = [compiled.create_infer_request() for _ in range(nreq)]
    specs = json.loads(args.inputs)
    rng = np.random.default_rng(0)
    cache: dict[int, list[list[np.ndarray]]] = {}

    def parts(batch: int) -> list[list[np.ndarray]]:
        if batch not in cache:
            full = [
                rng.standard_normal((batch, *s["shape"])).astype(s["dtype"])
                if s["dtype"].startswith("float")
                else rng.integers(0, s["high"] or 2, (batch, *s["shape"])).astype(s["dtype"])
                for s in specs
            ]
            n = min(nreq, batch)
            cache.clear()
            cache[batch] = [
                [np.ascontiguousarray(a) for a in chunk]
                for chunk in zip(*(np.array_split(x, n) for x in full), strict=True)
            ]
        return cache[batch]

    info = {
        "event": "ready",
        "streams": int(compiled.get_property("NUM_STREAMS")),
        "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
        "requests": nreq,
        "precision": str(compiled.get_property("INFERENCE_PRECISION_HINT")),
    }
    proto.write(json.dumps(info) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") != "run":
            proto.write(json.dumps({"ok": True}) + "\n")
            break
        chunks = parts(int(msg["batch"]))
        start = time.monotonic()
        for request, chunk in zip(requests, chunks, strict=False):
            request.start_async(dict(enumerate(chunk)))
        for request in requests[: len(chunks)]:
            request.wait()
        proto.write(json.dumps({"start": start, "end": time.monotonic()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
