"""Golden checks for a behaviour-preserving refactor of the controller (issue 36).

Drives fixed scenarios through the real reconcilers against the unit tests' in-memory API
(``tests/support/kube_support.py``'s ``FakeKube``) and records, after every pass, every object
in the API (rendered Deployments, Services, ConfigMaps, Jobs, the status written), the pass's
result, the next-pass schedule the daemon would choose for a grid of models, and every CLI
help text.

    python scripts/golden_controller.py --record   # writes scripts/golden/controller.json.gz
    python scripts/golden_controller.py            # compares with it; exit 1 on a difference

Run it from the repository root with ``PYTHONPATH=operator``. A difference prints the first
differing path; behaviour-preserving work must leave the record unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gzip
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "scripts" / "golden" / "controller.json.gz"
sys.path.insert(0, str(ROOT / "tests" / "support"))

from kube_support import NS, T0, FakeKube, profile_json  # noqa: E402

from packrat.controller.core.context import Config  # noqa: E402
from packrat.controller.model.reconcile import Reconciler, Result  # noqa: E402
from packrat.controller.pipeline.reconcile import PipelineReconciler  # noqa: E402
from packrat.controller.planning import autobatch as ab  # noqa: E402
from packrat.controller.planning.autoscale import Arrivals  # noqa: E402
from packrat.controller.profiling.manifests import profile_configmap  # noqa: E402

BASE: dict[str, Any] = {
    "model": {"zoo": "tiny"},
    "cpus": 2,
    "profiling": {"maxBatch": 8},
    "switch": {"readyTimeoutSeconds": 60, "drainSeconds": 5},
}
AUTO = {"min": 1, "max": 8, "sustainObservations": 2, "minIntervalSeconds": 60, "minGain": 0.05}
SLO = {"latencyP99Ms": 20, "rate": 2000, "durationSeconds": 4, "maxCores": 12}


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def _masked(objects: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    """Every object, random tokens masked."""
    out: dict[str, Any] = {}
    for (resource, ns, name), obj in sorted(objects.items()):
        doc = copy.deepcopy(obj)
        if resource == "secrets":
            doc["data"] = {k: "<masked>" for k in doc.get("data") or {}}
            doc["stringData"] = {k: "<masked>" for k in doc.get("stringData") or {}}
        out[f"{resource}/{ns}/{name}"] = doc
    return out


def _result(res: Result) -> dict[str, Any]:
    return {
        "result": res.result,
        "phase": res.phase,
        "waiting": res.waiting,
        "retry_seconds": res.retry_seconds,
        "events": [list(e) for e in res.events],
        "switch_result": res.switch_result,
        "switch_seconds": res.switch_seconds,
        "observed_batch": res.observed_batch,
        "decision": str(res.decision) if res.decision is not None else None,
        "autoscale": res.autoscale,
        "plan": res.plan.to_dict() if res.plan is not None else None,
    }


class Recorder:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.steps: list[dict[str, Any]] = []
        self.seen: dict[str, Any] = {}

    def snap(self, label: str, res: Result | None = None) -> None:
        """The objects changed (or gone: None) since the last snapshot, and the result."""
        now = json.loads(json.dumps(_masked(self.kube.objects), default=str))
        changed = {k: v for k, v in now.items() if self.seen.get(k) != v}
        changed.update({k: None for k in self.seen if k not in now})
        self.seen = now
        step: dict[str, Any] = {"step": label, "objects": changed}
        if res is not None:
            step["result"] = _result(res)
        self.steps.append(json.loads(json.dumps(step, default=str)))


def _model(spec: dict[str, Any], **reconciler: Any) -> tuple[FakeKube, Reconciler]:
    kube = FakeKube()
    body = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratModel",
        "metadata": {"name": "tiny", "namespace": NS, "uid": "u1"},
        "spec": spec,
    }
    kube.create("packratmodels", NS, body)
    config = Config(image="img", profile_retry_seconds=10)
    return kube, Reconciler(kube, config=config, **reconciler)


def _to_ready(kube: FakeKube, rec: Reconciler, r: Recorder, **kw: Any) -> None:
    r.snap("profile-job", rec.reconcile(NS, "tiny", now=T0, **kw))
    kube.finish_job(ok=True, log=profile_json())
    r.snap("deploy", rec.reconcile(NS, "tiny", now=T0, **kw))
    kube.make_ready("tiny-a")
    r.snap("ready", rec.reconcile(NS, "tiny", now=T0, **kw))


def _spec_patch(kube: FakeKube, **changes: Any) -> None:
    kube.patch("packratmodels", NS, "tiny", {"spec": changes})


def fixed_batch() -> list[dict[str, Any]]:
    """Profile, serve, switch to a new batch, abort a switch, fail over."""
    kube, rec = _model({**BASE, "batchSize": 4})
    r = Recorder(kube)
    _to_ready(kube, rec, r)
    r.snap("at-rest", rec.reconcile(NS, "tiny", now=_at(1)))
    _spec_patch(kube, batchSize=8)
    r.snap("switch-start", rec.reconcile(NS, "tiny", now=_at(2)))
    r.snap("switch-wait", rec.reconcile(NS, "tiny", now=_at(3)))
    kube.make_ready("tiny-b")
    r.snap("switch-moved", rec.reconcile(NS, "tiny", now=_at(4)))
    r.snap("switch-draining", rec.reconcile(NS, "tiny", now=_at(5)))
    r.snap("switch-done", rec.reconcile(NS, "tiny", now=_at(20)))
    _spec_patch(kube, batchSize=2)
    r.snap("switch2-start", rec.reconcile(NS, "tiny", now=_at(30)))
    r.snap("switch2-abort", rec.reconcile(NS, "tiny", now=_at(200)))
    r.snap("after-abort", rec.reconcile(NS, "tiny", now=_at(201)))
    _spec_patch(kube, batchSize=4)
    r.snap("switch3-start", rec.reconcile(NS, "tiny", now=_at(300)))
    kube.delete("deployments", NS, "tiny-b")
    r.snap("failover", rec.reconcile(NS, "tiny", now=_at(301)))
    for dep in kube.of("deployments"):
        kube.make_ready(dep)
    r.snap("failover-2", rec.reconcile(NS, "tiny", now=_at(302)))
    r.snap("failover-3", rec.reconcile(NS, "tiny", now=_at(400)))
    _spec_patch(kube, batchSize=1)
    r.snap("switch4-start", rec.reconcile(NS, "tiny", now=_at(410)))
    for dep in kube.of("deployments"):
        kube.make_ready(dep)
    r.snap("switch4-moved", rec.reconcile(NS, "tiny", now=_at(411)))
    active = kube.prm()["status"]["activeSlot"]
    kube.delete("deployments", NS, f"tiny-{active}")
    r.snap("switch4-active-lost", rec.reconcile(NS, "tiny", now=_at(412)))
    for dep in kube.of("deployments"):
        kube.make_ready(dep)
    r.snap("switch4-after", rec.reconcile(NS, "tiny", now=_at(413)))
    _spec_patch(kube, memory="3Gi", cpus=2)
    r.snap("memory", rec.reconcile(NS, "tiny", now=_at(500)))
    kube.patch("packratmodels", NS, "tiny", {"metadata": {"deletionTimestamp": "x"}})
    return r.steps


class Feed:
    def __init__(self) -> None:
        self.next: list[int] | ab.Reading | None = None

    def __call__(self, namespace: str, name: str) -> list[int] | ab.Reading | None:
        return self.next


def auto_batch() -> list[dict[str, Any]]:
    feed = Feed()
    kube, rec = _model({**BASE, "autoBatch": AUTO}, estimates=feed)
    r = Recorder(kube)
    _to_ready(kube, rec, r)
    feed.next = [8, 8, 2]
    r.snap("observe-1", rec.reconcile(NS, "tiny", now=_at(1)))
    r.snap("observe-2", rec.reconcile(NS, "tiny", now=_at(2)))
    r.snap("switch", rec.reconcile(NS, "tiny", now=_at(3)))
    slot = kube.prm()["status"]["switch"]["targetSlot"]
    kube.make_ready(f"tiny-{slot}")
    r.snap("moved", rec.reconcile(NS, "tiny", now=_at(4)))
    r.snap("done", rec.reconcile(NS, "tiny", now=_at(14)))
    feed.next = [1]
    r.snap("too-soon-1", rec.reconcile(NS, "tiny", now=_at(15)))
    r.snap("too-soon-2", rec.reconcile(NS, "tiny", now=_at(16)))
    kube.patch(
        "packratmodels",
        NS,
        "tiny",
        {"metadata": {"annotations": {ab.RECONFIGURE_ANNOTATION: "now"}}},
    )
    r.snap("trigger", rec.reconcile(NS, "tiny", now=_at(17)))
    r.snap("trigger-switch", rec.reconcile(NS, "tiny", now=_at(18)))
    r.snap("trigger-abort", rec.reconcile(NS, "tiny", now=_at(200)))
    feed.next = ab.Reading((4, 4), "pods")
    r.snap("reading", rec.reconcile(NS, "tiny", now=_at(300)))
    return r.steps


def slo_tuner() -> list[dict[str, Any]]:
    from packrat.plan.traces import gamma_trace

    auto = {"minReplicas": 1, "maxReplicas": 8, "scaleDownDelaySeconds": 30}
    kube, rec = _model({**BASE, "slo": SLO, "autoscaling": auto})
    r = Recorder(kube)
    _to_ready(kube, rec, r)
    t0 = T0.timestamp()
    r.snap("no-arrivals", rec.reconcile(NS, "tiny", now=_at(1), arrivals=None))
    burst = (t0 + 1 + gamma_trace(8000, duration_s=5, seed=1)).tolist()
    res = rec.reconcile(NS, "tiny", now=_at(6), arrivals=Arrivals(times=burst, pods=1))
    r.snap("burst", res)
    quiet = (t0 + 40 + gamma_trace(2000, duration_s=5, seed=2)).tolist()
    res = rec.reconcile(NS, "tiny", now=_at(45), arrivals=Arrivals(times=quiet, pods=1))
    r.snap("quiet", res)
    return r.steps


def slo_autobatch() -> list[dict[str, Any]]:
    feed = Feed()
    kube, rec = _model({**BASE, "slo": SLO, "autoBatch": AUTO}, estimates=feed)
    r = Recorder(kube)
    _to_ready(kube, rec, r)
    feed.next = [8, 8]
    r.snap("observe-1", rec.reconcile(NS, "tiny", now=_at(1)))
    r.snap("observe-2", rec.reconcile(NS, "tiny", now=_at(2)))
    r.snap("observe-3", rec.reconcile(NS, "tiny", now=_at(3)))
    return r.steps


def failures() -> list[dict[str, Any]]:
    kube, rec = _model({**BASE, "batchSize": 4})
    r = Recorder(kube)
    r.snap("job", rec.reconcile(NS, "tiny", now=T0))
    kube.finish_job(ok=False, message="oom")
    r.snap("failed-job", rec.reconcile(NS, "tiny", now=_at(1)))
    r.snap("retry", rec.reconcile(NS, "tiny", now=_at(20)))
    kube2, rec2 = _model({**BASE, "batchSize": 4, "cpus": -1})
    r2 = Recorder(kube2)
    r2.snap("invalid", rec2.reconcile(NS, "tiny", now=T0))
    return r.steps + r2.steps


def pipeline() -> list[dict[str, Any]]:
    stage = {**BASE, "switch": {"readyTimeoutSeconds": 60, "drainSeconds": 0}}
    body = {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPipeline",
        "metadata": {"name": "chain", "namespace": NS, "uid": "p1"},
        "spec": {
            "stages": [{"name": "first", "model": stage}, {"name": "second", "model": stage}],
            "edges": [{"from": "first", "to": "second", "fraction": 1.0}],
            "slo": {"latencyP99Ms": 200, "rate": 20, "cv": 1.0, "durationSeconds": 30},
        },
    }
    kube = FakeKube()
    config = Config(image="img")
    pipes = PipelineReconciler(kube, config=config)
    models = Reconciler(kube, config=config)
    kube.create("packratpipelines", NS, body)
    r = Recorder(kube)
    now = T0
    for i in range(8):
        now += datetime.timedelta(seconds=5)
        pipes.reconcile(NS, "chain", now=now)
        for name in kube.of("packratmodels"):
            models.reconcile(NS, name, now=now)
            obj = kube.get("packratmodels", NS, name) or {}
            if ((obj.get("status") or {}).get("profile") or {}).get("key"):
                from packrat.controller.core.model import parse

                spec = parse(obj, default_image="img")
                cm = profile_configmap(spec, profile_json=profile_json(), cpu_model="Test")
                kube.create("configmaps", NS, cm)
        for dep in kube.of("deployments"):
            kube.make_ready(dep)
        r.snap(f"round-{i}")
    # drift: a child's spec changed by hand is put back
    kube.patch("deployments", NS, "chain-router", {"spec": {"replicas": 7}})
    kube.patch("packratmodels", NS, "chain-first", {"spec": {"cpus": 4}})
    pipes.reconcile(NS, "chain", now=now + datetime.timedelta(seconds=5))
    r.snap("drift")
    return r.steps


def schedule() -> list[dict[str, Any]]:
    """The daemon's next-pass decision for a grid of models and pass results."""
    from golden_schedule import decisions

    return decisions()


def cli_help() -> dict[str, str]:
    from packrat.cli import COMMANDS, build_parser

    out: dict[str, str] = {}
    for argv in [["--help"], *([c, "--help"] for c in COMMANDS)]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            build_parser().parse_args(argv)
        out[" ".join(argv)] = buf.getvalue()
    return out


SCENARIOS: dict[str, Callable[[], Any]] = {
    "fixed_batch": fixed_batch,
    "auto_batch": auto_batch,
    "slo_tuner": slo_tuner,
    "slo_autobatch": slo_autobatch,
    "failures": failures,
    "pipeline": pipeline,
    "schedule": schedule,
    "cli_help": cli_help,
}


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}/{key}: only in {'recorded' if key in a else 'now'}"
            found = _first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items recorded, {len(b)} now"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: recorded {a!r:.300}, now {b!r:.300}"


def _fixed_clock() -> None:
    """The one wall-clock read of a pass (a switch's selector time) made repeatable."""
    from packrat.controller.switch import active_passive

    active_passive._now = lambda: T0 + datetime.timedelta(hours=1)  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="write the golden record")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    _fixed_clock()
    now = {name: json.loads(json.dumps(run(), default=str)) for name, run in SCENARIOS.items()}
    if args.record:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(now, indent=1, sort_keys=True) + "\n"
        GOLDEN.write_bytes(gzip.compress(text.encode(), mtime=0))
        print(f"recorded {GOLDEN.relative_to(ROOT)}")
        return 0
    recorded = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    diff = _first_difference(recorded, now)
    if diff:
        print(f"golden check FAILED at {diff}")
        return 1
    print("golden check: identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
