"""Engines through the operator (issue 35): ``spec.engines`` on the API emulator with the real
kopf operator, the real profiling Job and real ``packrat serve`` pods of the tiny model.

1. ``spec.engines: [eager, onnxruntime]`` with a shared ``artefactsClaim`` and 2 replicas is
   profiled for real: the Job runs ``packrat profile --engines eager,onnxruntime
   --missing-engines leave-out --artefacts /artefacts``, converts ONNX Runtime once onto the
   claim, checks it against eager and profiles both; EnginesVerified is True and the stored
   profile has points of both engines. Both pods' ``convert-engines`` find the Job's artefact
   (converted_now false) and check it; the artefact is never rewritten. The model is served
   on the plan's engine, whichever the profile made fastest (``packrat_plan_engine``).
2. A model whose profile makes ONNX Runtime fastest (seeded, so the plan's engine is known) is
   served on ONNX Runtime: its plan label and ``status.plan.engine`` say it, the pod's
   ``convert-engines`` init container converted (no claim: into its own emptyDir) and checked
   the artefact under the profile's cache key, the ``serve`` container loaded it
   (``--artefacts``) and answers.

No timing assertions; every wait polls a condition with a deadline sized for a loaded machine.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from harness import OperatorCluster, wait_for
from models import body, tiny_spec, wait_ready
from seeding import seed_profile

from packrat.plan.profile import ENGINES_KEY, Profile, ProfileMeta, ProfilePoint, parse_profile
from packrat.runtime.engines import engine as get_engine

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        get_engine("onnxruntime").missing() is not None,
        reason="needs the onnxruntime extra (make venv installs it)",
    ),
]

ENGINES = ["eager", "onnxruntime"]
CLAIM = "engine-artefacts"  # the agent plays it as one directory every pod shares


def _serving_pods(cluster: OperatorCluster, name: str) -> list[Any]:
    """The active slot's running pods whose init containers are done."""
    active = cluster.status(name)["activeSlot"]
    return [
        p
        for p in list(cluster.agent.pods.values())
        if p.owner_kind != "Job" and p.owner_name == f"{name}-{active}" and p.ready
    ]


def _serving_pod(cluster: OperatorCluster, name: str) -> Any:
    pods = _serving_pods(cluster, name)
    assert pods, f"no ready pod of {name}"
    return pods[0]


def _verdicts(pod: Any) -> list[dict[str, Any]]:
    """``packrat convert``'s verdicts in the pod's convert-engines log, one per engine."""
    log = (pod.workdir / "convert-engines.log").read_text(errors="replace")
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def _plan_engine_metric(cluster: OperatorCluster, pod: Any) -> str:
    """The engine the pod's ``packrat_plan_engine`` gauge says it runs (value 1)."""
    url = f"{cluster.agent.proxy.pod_url(pod.name)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    running = [
        line.split('engine="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("packrat_plan_engine{") and line.rstrip().endswith(" 1.0")
    ]
    assert len(running) == 1, text[-2000:]
    return running[0]


def test_engines_are_profiled_by_the_job_and_served_on_the_plans_engine(
    cluster: OperatorCluster,
) -> None:
    name = "engines"
    # the time budget covers every engine's points (the tiny model's take seconds each)
    spec = tiny_spec(
        4, engines=ENGINES, batchSize=2, budget_s=300, replicas=2, artefactsClaim=CLAIM
    )
    cluster.api.create("packratmodels", body(name, spec))
    job = wait_for(  # the operator deletes the Job once it stored the profile
        lambda: next(
            (j for j in cluster.api.list("jobs") if j["metadata"]["name"].startswith(name)), None
        ),
        timeout=240,
        what="the profiling Job",
        period=0.1,
    )
    status = wait_ready(cluster, name)
    (profile_c,) = [
        c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "profile"
    ]
    cmd = profile_c["command"]
    assert cmd[cmd.index("--engines") + 1] == "eager,onnxruntime"
    assert cmd[cmd.index("--artefacts") + 1] == "/artefacts"
    assert cmd[cmd.index("--missing-engines") + 1] == "leave-out"

    verified = cluster.condition(name, "EnginesVerified")
    assert verified.get("status") == "True", verified
    cm = cluster.api.get("configmaps", f"{name}-profile-{status['profile']['key'][:8]}")
    assert cm is not None
    profile = parse_profile(cm["data"]["profile.json"], origin="stored")
    assert profile.engines == ENGINES
    record = profile.meta.extra[ENGINES_KEY]["onnxruntime"]
    assert record["status"] == "ok" and record["converted_now"] is True

    # converted once, by the Job, onto the shared claim; every pod found it there and checked it
    manifest = next((cluster.agent.workdir / "claims" / CLAIM).rglob("artefact.json"))
    written = manifest.stat().st_mtime_ns
    wait_for(lambda: len(_serving_pods(cluster, name)) == 2, timeout=240, what="two pods")
    pods = _serving_pods(cluster, name)
    for pod in pods:
        (verdict,) = _verdicts(pod)
        assert verdict["status"] == "ok" and verdict["converted_now"] is False, verdict
        assert verdict["artefact"]["path"].startswith(str(manifest.parent)), verdict
    assert manifest.stat().st_mtime_ns == written  # never rewritten

    engine = (status.get("plan") or {}).get("engine") or "eager"
    for pod in pods:
        wait_for(
            lambda pod=pod: _plan_engine_metric(cluster, pod) == engine,
            timeout=120,
            what=f"the pod serving the plan's engine {engine}",
        )
    code, _ = cluster.predict(name, name)
    assert code == 200


def _ort_fastest_profile() -> Profile:
    """The tiny model on 2 cores where ONNX Runtime beats eager at every point."""
    eager = {(1, 1): 1.0, (1, 2): 1.8, (1, 4): 3.5, (2, 1): 0.8, (2, 2): 1.2, (2, 4): 2.2}
    points = [ProfilePoint(threads=t, batch=b, latency_ms=v) for (t, b), v in eager.items()]
    points += [
        ProfilePoint(threads=t, batch=b, latency_ms=v / 2, engine="onnxruntime")
        for (t, b), v in eager.items()
    ]
    meta = ProfileMeta(
        model="tiny",
        cpu_model="Test CPU",
        cpus=2,
        extra={
            "grid": {"threads": [1, 2], "batches": [1, 2, 4]},
            "complete": True,
            ENGINES_KEY: {"eager": {"status": "ok"}, "onnxruntime": {"status": "ok"}},
        },
    )
    return Profile(meta=meta, points=tuple(points))


def test_a_plan_on_onnxruntime_is_served_from_the_pods_checked_artefact(
    cluster: OperatorCluster,
) -> None:
    name = "engines-ort"
    spec = tiny_spec(4, engines=ENGINES, batchSize=2)
    cluster.api.create("packratmodels", body(name, spec))
    seed_profile(cluster, name, _ort_fastest_profile())
    status = wait_ready(cluster, name)
    plan = status["plan"]
    assert plan.get("engine") == "onnxruntime", plan
    assert "onnxruntime" in str(status.get("plan", {}).get("label") or status.get("activePlan"))

    pod = _serving_pod(cluster, name)
    init = [c["name"] for c in pod.spec["initContainers"]]
    assert "convert-engines" in init
    (serve,) = pod.spec["containers"]
    assert serve["command"][serve["command"].index("--artefacts") + 1] == "/artefacts"
    verdicts = _verdicts(pod)
    assert [v["engine"] for v in verdicts] == ["onnxruntime"], verdicts
    assert verdicts[0]["status"] == "ok" and "check" in verdicts[0], verdicts
    assert verdicts[0]["converted_now"] is True  # its own emptyDir: converted in this pod
    artefact = verdicts[0]["artefact"]["path"]
    assert artefact.startswith(str(pod.workdir)), artefact  # the pod's own artefacts volume

    wait_for(
        lambda: _plan_engine_metric(cluster, pod) == "onnxruntime",
        timeout=120,
        what="the pod serving onnxruntime",
    )
    code, answer = cluster.predict(name, name)
    assert code == 200, answer
