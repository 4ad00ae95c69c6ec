"""spec.slo + spec.autoscaling end to end: the real operator provisions for the SLO and its
tuner scales the active Deployment up when the arrivals the real pods see exceed the plan.

The operator (kopf subprocess) runs against the kmock emulator; the test agent runs the real
``packrat serve`` pods (tiny model) and publishes them, so the operator reads each ready pod's
``GET /arrivals``. The test is not about profiling: the model gets the session's measured
profile (``tiny_profiles``) as its profile ConfigMap as soon as the operator keys it. The
SLO's sample trace is gamma arrivals at 2/s; closed-loop clients through the Service then
send far more than that, so the envelope's rates exceed what the planned replicas sustain
and the tuner must scale up. The scale-down delay is longer than the test, so the count
cannot move back while it is checked. No timing assertions: every wait polls a condition
with a deadline sized for a loaded 2-core machine.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import Load, OperatorCluster, wait_for
from models import body, tiny_spec, wait_ready
from seeding import MeasuredProfiles, seed_profile

# the session's profile may be measured here first (minutes on a loaded machine)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

NAME = "tuned"
SPEC: dict[str, Any] = tiny_spec(
    4,
    budget_s=30,
    ready_timeout_s=120,
    slo={"latencyP99Ms": 500, "rate": 2, "durationSeconds": 60},
    autoscaling={
        "minReplicas": 1,
        "maxReplicas": 3,
        "scaleDownDelaySeconds": 3600,
        "intervalSeconds": 1,
    },
)
SLOW = 240.0


def test_tuner_scales_up_from_the_pods_arrivals_without_failures(
    cluster: OperatorCluster, tiny_profiles: MeasuredProfiles
) -> None:
    cluster.api.create("packratmodels", body(NAME, SPEC))
    seed_profile(cluster, NAME, tiny_profiles.profile(SPEC["profiling"]["maxBatch"]))
    wait_ready(cluster, NAME, period=0.5)
    status = cluster.status(NAME)
    prov = status["provisioning"]
    assert prov["feasible"] is True and prov["replicas"] == 1
    assert cluster.condition(NAME, "Provisioned")["reason"] == "Feasible"
    planned = prov["replicas"]
    with Load(cluster, NAME, NAME, clients=3) as load:
        scaled = wait_for(
            lambda: (
                (cluster.status(NAME).get("autoscaling") or {}).get("replicas", 0) > planned
                and cluster.status(NAME)["autoscaling"]
            ),
            timeout=SLOW,
            what="the tuner scaling up",
            period=0.5,
            detail=lambda: f"status: {cluster.status(NAME)}\nlog:\n{cluster.log_tail(20)}",
        )
        wanted = int(scaled["replicas"])
        # lastDecision may already be a later pass's hold; lastScale is the change itself
        assert scaled["lastScale"]["action"] == "scale_up"
        assert "scale up" in scaled["lastScale"]["reason"]
        assert scaled["lastScale"]["replicas"] == wanted
        wait_for(
            lambda: cluster.status(NAME).get("readyReplicas", 0) >= wanted,
            timeout=SLOW,
            what=f"{wanted} ready replicas",
            period=0.5,
        )
        dep = cluster.api.get("deployments", f"{NAME}-{cluster.status(NAME)['activeSlot']}")
        assert dep is not None and dep["spec"]["replicas"] >= wanted
    assert load.results and not load.failures, load.failures[:5]
    wait_for(  # a pass posts its Events after its writes
        lambda: [e for e in cluster.events("ScaledUp") if NAME in str(e.get("involvedObject"))],
        timeout=60,
        what="a ScaledUp Event",
    )
