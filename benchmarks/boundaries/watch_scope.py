"""The operator's memory and watch traffic with many unrelated objects in its namespace.

Issue 29 item 4: the operator used to watch every ConfigMap, Pod, Deployment, Service and Job
in its namespaces and drop the ones without Packrat's labels in Python (kopf's ``labels=``
filter is client-side), so its memory and watch traffic grew with the cluster. Now the API
server filters (``labelSelector`` on every child watch).

Each run starts the kmock emulator (the integration harness's, which honours label
selectors), fills the namespace with ``--unrelated`` ConfigMaps and as many Pods that carry
no Packrat label (or none), starts the real operator process, creates one PackratModel with
a seeded profile (its Deployments faked ready), waits until it is Ready, lets it settle and
then reads the operator's resident memory (VmRSS, and the peak VmHWM, from /proc) and what
the emulator sent it, by resource: the items of its list answers (kopf lists, then watches)
and the watch events. Configurations: the operator before the
change (``--before-rev``, run from a ``git archive`` of that revision) and after (this
tree), each with and without the unrelated objects, interleaved (A B C D, A B C D, ...)
``--repeat`` times.

Run: ``.venv/bin/python benchmarks/boundaries/watch_scope.py --out
benchmarks/results/watch-scope.json`` (about 8 minutes). A benchmark, not a test: one shared,
noisy machine; read the medians and the spread, and the load average printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))
sys.path.insert(0, str(ROOT / "benchmarks" / "boundaries"))

from controller_faults import SPEC, FakeDeployments, _body, _profile_json  # noqa: E402
from emulator import Api, EmulatorThread  # noqa: E402
from harness import TEST_IMAGE, wait_for  # noqa: E402

from packrat.controller.core.model import parse  # noqa: E402
from packrat.controller.profiling import manifests as pm  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the operator ride out faults, and what does it cost at scale?"'
    " (#how-does-the-operator-ride-out-faults-and-what-does-it-cost-at-scale)"
)

NAMESPACE = "packrat-test"
DEFAULT_BEFORE = "c4b2221"  # the last commit before server-side label selectors (house29)


def _fill(emulator: Any, n: int) -> None:
    """``n`` unrelated ConfigMaps and ``n`` unrelated Pods, of a realistic size (another
    team's application: labels, a 512-byte config, a container spec and status)."""
    now = "2026-01-01T00:00:00Z"
    for i in range(n):
        meta = {
            "name": f"app-{i}",
            "namespace": NAMESPACE,
            "uid": f"cm-{i}",
            "resourceVersion": str(10_000_000 + i),
            "creationTimestamp": now,
            "labels": {"app": f"app-{i % 50}", "team": "other"},
        }
        emulator.objects["v1/configmaps", NAMESPACE, meta["name"]] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"config.yaml": "x" * 512},
        }
        pod_meta = {**meta, "name": f"app-{i}-pod", "uid": f"pod-{i}"}
        emulator.objects["v1/pods", NAMESPACE, pod_meta["name"]] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod_meta,
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.example.com/app:1.2.3",
                        "ports": [{"containerPort": 8080}],
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                        "env": [{"name": f"VAR_{k}", "value": "value"} for k in range(5)],
                    }
                ],
                "nodeName": f"node-{i % 20}",
            },
            "status": {"phase": "Running", "podIP": f"10.1.{i // 250}.{i % 250}"},
        }


def _memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def _operator_events(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    """What the operator (any client but the benchmark's own) was sent, by resource."""
    out: dict[str, int] = {}
    for (path, agent), n in counts.items():
        if agent == "Python-urllib":
            continue
        plural = path.rsplit("/", 1)[-1]
        out[plural] = out.get(plural, 0) + n
    return out


def run_one(
    *, version: str, pythonpath: Path, unrelated: int, settle: float, workdir: Path, tag: str
) -> dict[str, Any]:
    thread = EmulatorThread().start()
    emulator = thread.emulator
    assert emulator is not None
    api = Api(thread.url, NAMESPACE)
    _fill(emulator, unrelated)
    kubeconfig = thread.write_kubeconfig(workdir / f"kubeconfig-{tag}.json", namespace=NAMESPACE)
    fake = FakeDeployments(api)
    fake.start()
    log = (workdir / f"operator-{tag}.log").open("wb")
    cmd = [
        sys.executable, "-m", "packrat", "operator", "--namespace", NAMESPACE,
        "--poll-seconds", "0.5", "--image", TEST_IMAGE,
        "--serving-url", "http://127.0.0.1:9/{service}",
    ]  # fmt: skip
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=str(pythonpath))
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        api.create("packratmodels", _body("m0", SPEC))
        obj = api.get("packratmodels", "m0")
        assert obj is not None
        model = parse(obj, default_image=TEST_IMAGE)
        api.create("configmaps", pm.profile_configmap(model, profile_json=_profile_json()))
        wait_for(
            lambda: (
                (api.get("packratmodels", "m0") or {}).get("status", {}).get("phase") == "Ready"
            ),
            timeout=600,
            what="m0 Ready",
            period=0.5,
        )
        ready_s = time.monotonic() - started
        time.sleep(settle)  # at rest: what it holds, not a transient
        rss, hwm = _memory_kib(proc.pid)
        return {
            "version": version,
            "unrelated": unrelated,
            "rss_mib": round(rss / 1024, 1),
            "peak_rss_mib": round(hwm / 1024, 1),
            "ready_s": round(ready_s, 1),
            "watch_events": _operator_events(emulator.watch_events),
            "listed_items": _operator_events(emulator.listed_items),
            "watch_selectors": {
                p.rsplit("/", 1)[-1]: sorted(s) for p, s in emulator.watch_selectors.items()
            },
        }
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        fake.stop.set()
        thread.stop()


def _before_tree(rev: str, workdir: Path) -> Path:
    tree = workdir / f"before-{rev}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "operator"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree / "operator"


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--unrelated", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--before-rev", default=DEFAULT_BEFORE)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")
    workdir = Path(tempfile.mkdtemp(prefix="watch-scope-"))
    trees = {"before": _before_tree(args.before_rev, workdir), "after": ROOT / "operator"}
    configs = [(v, n) for v in ("before", "after") for n in (0, args.unrelated)]
    runs = []
    for i in range(args.repeat):
        for version, unrelated in configs:
            tag = f"{version}-{unrelated}-{i}"
            run = run_one(
                version=version,
                pythonpath=trees[version],
                unrelated=unrelated,
                settle=args.settle,
                workdir=workdir,
                tag=tag,
            )
            run["load_avg"] = os.getloadavg()[0]
            print(json.dumps(run), flush=True)
            runs.append(run)
    summary: dict[str, Any] = {}
    for version, unrelated in configs:
        mine = [r for r in runs if r["version"] == version and r["unrelated"] == unrelated]
        rss = [r["rss_mib"] for r in mine]
        events = [sum(r["watch_events"].values()) + sum(r["listed_items"].values()) for r in mine]
        summary[f"{version}/{unrelated}"] = {
            "rss_mib_median": statistics.median(rss),
            "rss_mib_range": [min(rss), max(rss)],
            "peak_rss_mib_median": statistics.median(r["peak_rss_mib"] for r in mine),
            "objects_received_median": statistics.median(events),
        }
    for version in ("before", "after"):
        base = summary[f"{version}/0"]["rss_mib_median"]
        loaded = summary[f"{version}/{args.unrelated}"]["rss_mib_median"]
        summary[f"{version}_rss_ratio"] = round(loaded / base, 3)
    result = {
        "unrelated_configmaps": args.unrelated,
        "unrelated_pods": args.unrelated,
        "before_rev": args.before_rev,
        "repeat": args.repeat,
        "runs": runs,
        "summary": summary,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
