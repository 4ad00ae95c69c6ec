"""The reconciler under faults and at scale, measured on the kmock emulator with the real operator.

``faults``: one model served by real ``packrat serve`` pods (the integration harness's agent),
closed-loop load through the Service; for "active Deployment deleted during a failing
switch" and "Service deleted during a re-profile", the time from the fault until requests
succeed again (0 when none failed) and the number of failed requests, ``--repeat`` times
each. For the Deployment also the time until the last good spec is in the other slot and
until the fail-over is over (the Service on that slot, the deleted one gone).

``scale``: N models (1, 10, 50) whose pods are faked ready (no serving processes: a tiny
stand-in for the Deployment controller marks each Deployment ready) and whose profiles are
seeded; at rest, the operator's API requests per model per minute over ``--window``
seconds (counted by the emulator, the tests' own requests excluded), and the time from
deleting a child (the Service, the active Deployment) to its repair.

Run: ``.venv/bin/python benchmarks/boundaries/controller_faults.py faults`` (about 4 minutes) and
``.venv/bin/python benchmarks/boundaries/controller_faults.py scale`` (about 3 x (window + 30) s).
A benchmark, not a test: one shared, noisy machine; read medians and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))

from emulator import Api, EmulatorThread  # noqa: E402
from harness import TEST_IMAGE, Load, OperatorCluster, wait_for  # noqa: E402

from packrat.controller.api.drift import merge_patch  # noqa: E402
from packrat.controller.core.model import parse  # noqa: E402
from packrat.controller.profiling import manifests as pm  # noqa: E402
from packrat.plan.profile import Profile, ProfileMeta, ProfilePoint  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How does the operator ride out faults, and what does it cost at scale?"'
    " (#how-does-the-operator-ride-out-faults-and-what-does-it-cost-at-scale)"
)

NAMESPACE = "packrat-test"
SPEC: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "batchSize": 2,
    "maxBatchDelayMs": 2,
    "profiling": {
        "maxBatch": 4,
        "threads": [1, 2],
        "precision": 0.2,
        "timeBudgetSeconds": 30,
        "backoffLimit": 0,
    },
    "switch": {"readyTimeoutSeconds": 90, "drainSeconds": 2},
}


def _body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def _serving_again(load: Load, start: float, end: float) -> tuple[float, int]:
    window = [(t, code) for t, code in load.results if start <= t <= end]
    failures = [t for t, code in window if code != 200]
    if not failures:
        return 0.0, 0
    after = [t for t, code in window if t > failures[-1] and code == 200]
    return (after[0] - start if after else float("nan")), len(failures)


def _memory(cluster: OperatorCluster, dep_name: str) -> str | None:
    dep = cluster.api.get("deployments", dep_name) or {}
    containers = dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
    memory: str | None = containers[0].get("resources", {}).get("limits", {}).get("memory")
    return memory


def _at_rest(cluster: OperatorCluster, name: str) -> bool:
    status = cluster.status(name)
    return status.get("phase") == "Ready" and not status.get("switch")


def faults(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="faults-bench-"))
    cluster = OperatorCluster(workdir)
    name = "f"
    out: dict[str, Any] = {"active_deleted_during_failing_switch": [], "service_deleted": []}
    try:
        cluster.api.create("packratmodels", _body(name, SPEC))
        wait_for(lambda: _at_rest(cluster, name), timeout=900, what="Ready", period=0.25)
        for _ in range(args.repeat):
            active = cluster.status(name)["activeSlot"]
            other = "b" if active == "a" else "a"
            with Load(cluster, name, name) as load:
                wait_for(lambda: len(load.results) > 10, timeout=60, what="warm-up")
                cluster.api.patch(
                    "packratmodels",
                    name,
                    # fits no node: the switch never completes (the plan stays: a busy
                    # machine's profile may lack the points of a larger batch)
                    {"spec": {"memory": "2Ti", "switch": {"readyTimeoutSeconds": 300}}},
                )
                wait_for(
                    lambda: (cluster.status(name).get("switch") or {}).get("stage") == "rollout",
                    timeout=60,
                    what="rollout",
                )
                start = time.monotonic()
                cluster.api.delete("deployments", f"{name}-{active}")  # background: kubectl's
                # the operator's part: the last good spec rendered into the other slot
                wait_for(
                    lambda o=other: _memory(cluster, f"{name}-{o}") == "4Gi",
                    timeout=120,
                    what="last good spec in the other slot",
                    period=0.02,
                )
                rendered = time.monotonic() - start

                def failed_over(a: str = active, o: str = other) -> bool:
                    status = cluster.status(name)
                    names = {d["metadata"]["name"] for d in cluster.api.list("deployments")}
                    return (
                        status.get("activeSlot") == o
                        and status.get("phase") == "Ready"
                        and f"{name}-{a}" not in names
                    )

                # the other slot's new pods start like any pod (on a busy machine: minutes)
                wait_for(failed_over, timeout=900, what="failed over", period=0.1)
                moved = time.monotonic() - start
                time.sleep(1.0)
                seconds, failed = _serving_again(load, start, time.monotonic())
            out["active_deleted_during_failing_switch"].append(
                {
                    "last_good_rendered_s": round(rendered, 3),
                    "failed_over_s": round(moved, 3),
                    "serving_again_s": round(seconds, 3),
                    "failed_requests": failed,
                    "requests_during_fault": len(
                        [t for t, _ in load.results if start <= t <= start + moved]
                    ),
                }
            )
            # exactly SPEC again (a merge patch of SPEC alone would keep memory: 2Ti)
            current = cluster.model(name)["spec"]
            cluster.api.patch("packratmodels", name, {"spec": merge_patch(current, SPEC)})
            wait_for(lambda: _at_rest(cluster, name), timeout=900, what="rest", period=0.25)
        for _ in range(args.repeat):
            cm = cluster.status(name)["profile"]["configMap"]
            with Load(cluster, name, name) as load:
                wait_for(lambda: len(load.results) > 10, timeout=60, what="warm-up")
                cluster.api.delete("configmaps", cm)
                wait_for(lambda: cluster.api.list("jobs"), timeout=60, what="re-profile")
                start = time.monotonic()
                cluster.api.delete("services", name)
                wait_for(lambda: cluster.api.get("services", name), timeout=60, what="service")
                repaired = time.monotonic() - start
                still_profiling = bool(cluster.api.list("jobs"))
                wait_for(lambda: _at_rest(cluster, name), timeout=900, what="rest", period=0.25)
                seconds, failed = _serving_again(load, start, time.monotonic())
            out["service_deleted"].append(
                {
                    "service_back_s": round(repaired, 3),
                    "while_profiling": still_profiling,
                    "serving_again_s": round(seconds, 3),
                    "failed_requests": failed,
                }
            )
    finally:
        cluster.close()
    return out


# -- scale -------------------------------------------------------------------------------------
def _profile_json() -> str:
    lat = {(1, 1): 1.0, (1, 2): 1.8, (1, 4): 3.5, (2, 1): 0.8, (2, 2): 1.2, (2, 4): 2.2}
    points = tuple(ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in lat.items())
    return Profile(
        meta=ProfileMeta(model="tiny", cpu_model="bench", cpus=2), points=points
    ).to_json()


class FakeDeployments(threading.Thread):
    """Marks every Deployment ready (the Deployment controller and kubelet, faked)."""

    def __init__(self, api: Api) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for dep in self.api.list("deployments"):
                replicas = int(dep["spec"].get("replicas", 1))
                want = {
                    "observedGeneration": dep["metadata"].get("generation", 1),
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "updatedReplicas": replicas,
                    "availableReplicas": replicas,
                }
                have = dep.get("status") or {}
                if {k: have.get(k) for k in want} != want:
                    self.api.patch(
                        "deployments", dep["metadata"]["name"], {"status": want}, sub="status"
                    )


def _operator_requests(emulator: Any) -> int:
    return sum(
        n
        for (_, _, watch, agent), n in emulator.request_counts.items()
        if agent != "Python-urllib" and not watch
    )


def scale_one(n: int, *, window: float, resync: float, workdir: Path) -> dict[str, Any]:
    thread = EmulatorThread().start()
    emulator = thread.emulator
    api = Api(thread.url, NAMESPACE)
    kubeconfig = thread.write_kubeconfig(workdir / f"kubeconfig-{n}.json", namespace=NAMESPACE)
    fake = FakeDeployments(api)
    fake.start()
    log = (workdir / f"operator-{n}.log").open("wb")
    cmd = [
        sys.executable, "-m", "packrat", "operator", "--namespace", NAMESPACE,
        "--resync-seconds", str(resync), "--poll-seconds", "0.5", "--image", TEST_IMAGE,
        "--serving-url", "http://127.0.0.1:9/{service}",
    ]  # fmt: skip
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    profile = _profile_json()
    try:
        names = [f"m{i}" for i in range(n)]
        for name in names:
            api.create("packratmodels", _body(name, SPEC))
            obj = api.get("packratmodels", name)
            assert obj is not None
            model = parse(obj, default_image=TEST_IMAGE)
            api.create(
                "configmaps",
                pm.profile_configmap(model, profile_json=profile),
            )

        def all_ready() -> bool:
            phases = [(api.get("packratmodels", x) or {}).get("status", {}) for x in names]
            return all(p.get("phase") == "Ready" for p in phases)

        wait_for(all_ready, timeout=600, what=f"{n} models Ready", period=1.0)
        time.sleep(5.0)  # let the last transitions' passes settle
        before = _operator_requests(emulator)
        time.sleep(window)
        requests = _operator_requests(emulator) - before
        repairs: dict[str, float] = {}
        api.delete("services", "m0")
        start = time.monotonic()
        wait_for(lambda: api.get("services", "m0"), timeout=60, what="m0 Service", period=0.01)
        repairs["service_repair_s"] = round(time.monotonic() - start, 3)
        # the active Deployment is held by the operator's finalizer: repaired is the other slot
        # serving the last good spec, the Service on it and the deleted one gone
        api.delete("deployments", "m0-a")
        start = time.monotonic()

        def failed_over() -> bool:
            svc = api.get("services", "m0") or {}
            slot = (svc.get("spec") or {}).get("selector", {}).get("packrat.dev/slot")
            return slot == "b" and api.get("deployments", "m0-a") is None

        wait_for(failed_over, timeout=60, what="m0 failed over", period=0.01)
        repairs["deployment_repair_s"] = round(time.monotonic() - start, 3)
        return {
            "models": n,
            "window_s": window,
            "resync_s": resync,
            "requests": requests,
            "per_model_per_minute": round(requests / n / (window / 60.0), 3),
            **repairs,
        }
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        fake.stop.set()
        thread.stop()


def scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    return [
        scale_one(n, window=args.window, resync=args.resync_seconds, workdir=workdir)
        for n in args.models
    ]


def main() -> int:
    # the profile only seeds a plan here: a busy shared machine must not fail the profiling Job
    # (the agent's pods inherit this environment, as the tests' do from tests/conftest.py)
    os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    f = sub.add_parser("faults")
    f.add_argument("--repeat", type=int, default=3)
    s = sub.add_parser("scale")
    s.add_argument("--models", type=int, nargs="+", default=[1, 10, 50])
    s.add_argument("--window", type=float, default=120.0)
    s.add_argument("--resync-seconds", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    result: Any = faults(args) if args.what == "faults" else scale(args)
    if args.what == "faults":
        for key, runs in result.items():
            values = [r["serving_again_s"] for r in runs]
            result[key] = {"runs": runs, "median_serving_again_s": statistics.median(values)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
