"""How long does the operator take to check one PackratModel spec (``read_spec``: defaults,
the CRD's schema and CEL rules, the checks only Python makes)? Prints one JSON line: the
microseconds per read_spec over two specs (a minimal one and one with every option), per
round, and their median. Run it once per tree to compare, interleaved, e.g.

    for t in main wt/crdchecks; do PYTHONPATH=/work/$t/operator \\
        python benchmarks/controller/spec_check_cost.py --tree $t; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from packrat.controller.core.spec import read_spec

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does checking a spec against the CRD take?"'
    " (#how-long-does-checking-a-spec-against-the-crd-take)"
)

SPECS = [
    {"model": {"zoo": "tiny"}, "cpus": 4, "batchSize": 8},
    {
        "model": {"storageUri": "s3://b/m.pt", "format": "torchscript"},
        "cpus": 8,
        "autoBatch": {"min": 1, "max": 32},
        "slo": {"latencyP99Ms": 100, "rate": 20},
        "autoscaling": {"mode": "envelope"},
        "pod": {"labels": {"team": "a"}, "env": [{"name": "A", "value": "1"}]},
        "requestLogging": {"sink": "stdout"},
        "canary": {"model": {"zoo": "gpt2"}, "trafficPercent": 10},
    },
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE)
    parser.add_argument("--tree", default="", help="a label for the tree measured")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reads", type=int, default=200, help="reads of each spec per round")
    args = parser.parse_args()
    read_spec(SPECS[0])
    out = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.reads):
            for spec in SPECS:
                read_spec(spec)
        out.append((time.perf_counter() - start) / (args.reads * len(SPECS)) * 1e6)
    median = statistics.median(out)
    print(json.dumps({"tree": args.tree, "us_per_read_spec": out, "median": median}))


if __name__ == "__main__":
    main()
