"""The fast trigger on real pods, summarised from ``reconfig_experiment.py`` runs (issue 27 item 4).

Reads the runs' JSON (``react27-<before|final>-<n>.json.gz``: the status samples every 0.1 s)
and, where kept, the operator's verbose log (``operator-<which>-<n>.log.gz``) from a folder,
and prints per group (``before``: the operator before this change; ``final``: after it):

- how long the pods' estimate had held when the fast trigger fired (its own message in
  ``status.batchSize.lastDecision.fast``), against the hold it needs (1 s; 2 s for a
  neighbouring batch since ``near_hold``);
- seconds from the decision (``status.batchSize.target`` set) to the plan switched in status;
- the operator's API requests and passes per second while the model served (Ready to delete).

Run: ``.venv/bin/python benchmarks/reconfig/fast_trigger_summary.py benchmarks/results/react27``
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import itertools
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How fast does the fast trigger react, and what does it cost?"'
    " (#how-fast-does-the-fast-trigger-react-and-what-does-it-cost)"
)


def _decisions(samples: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    held, lag = [], []
    for before, after in itertools.pairwise(samples):
        if after.get("target") in (None, before.get("target")):
            continue
        message = after.get("fast") or ""
        found = re.search(r"held ([\d.]+)s", message)
        if found and message.startswith("sustained"):
            held.append(float(found.group(1)))
        index = samples.index(after)
        switched = next((s["t"] for s in samples[index:] if s["label"] != after["label"]), None)
        if switched is not None:
            lag.append(round(switched - after["t"], 2))
    return held, lag


def _stamp(line: str) -> dt.datetime:
    return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def _cost(path: Path) -> tuple[float, float] | None:
    if not path.exists():
        return None
    with gzip.open(path, "rt", errors="replace") as log:
        lines = log.read().splitlines()
    start = next((_stamp(x) for x in lines if "Normal Ready: serving" in x), None)
    end = next((_stamp(x) for x in lines if "Deletion is in progress" in x), None)
    if start is None or end is None:
        return None
    window = [x for x in lines if x.startswith("20") and start <= _stamp(x) < end]
    api = sum(1 for x in window if "urllib3.connectionpool" in x)
    passes = sum(
        1 for x in window if re.search(r"GET /apis/packrat.dev/\S+/packratmodels/\S+ HTTP", x)
    )
    seconds = (end - start).total_seconds()
    return api / seconds, passes / seconds


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"median {statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f}, n {len(v)})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURE)
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=Path("benchmarks/results/react27"),
        help="the runs' folder (default: %(default)s)",
    )
    folder: Path = parser.parse_args(argv).folder
    groups: dict[str, dict[str, list[float]]] = {}
    for path in sorted(folder.glob("react27-*-*.json.gz")):
        which, n = re.fullmatch(r"react27-(\w+)-(\d+)\.json\.gz", path.name).groups()  # type: ignore[union-attr]
        with gzip.open(path) as doc:
            samples = json.load(doc)["auto-fast"].get("samples") or []
        held, lag = _decisions(samples)
        group = groups.setdefault(which, {"held": [], "lag": [], "api": [], "passes": []})
        group["held"] += held
        group["lag"] += lag
        cost = _cost(folder / f"operator-{which}-{n}.log.gz")
        if cost is not None:
            group["api"].append(cost[0])
            group["passes"].append(cost[1])
        print(f"{which}-{n}: held when fired {held}; decision -> switched {lag}")
    for which, group in groups.items():
        print(f"\n{which}:")
        print(f"  estimate held when the trigger fired (s): {_spread(group['held'])}")
        print(f"  decision -> plan switched in status (s):  {_spread(group['lag'])}")
        print(f"  API requests per second while serving:    {_spread(group['api'])}")
        print(f"  passes per second while serving:          {_spread(group['passes'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
