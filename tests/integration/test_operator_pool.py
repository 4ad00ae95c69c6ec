"""A PackratPool on the emulator with real pods: two tiny PackratModels join it (spec.pool),
the operator places both on the pool's pod (python -m packrat.serve.pool, a real process),
both answer through their own Services, and a model moved out of the pool and back in keeps
answering through both moves (out: its own pods start and the Service leaves the pool pod
only once they are ready; in: the Service moves to the pool pod once it answers for the
model, and its own pods go after that); a second pool pod takes one of the two models,
moved while both answer: 0 failed requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from harness import TEST_IMAGE, Load, OperatorCluster, wait_for
from jsonhttp import http_json
from models import body, tiny_spec
from seeding import MeasuredProfiles, seed_profile

from packrat.controller.core.model import parse
from packrat.controller.pool.member import pooled_spec
from packrat.controller.serving.admin_token import secret_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

POOL = "pool"
MODELS = ("pa", "pb")
SLOW = 600.0


def _pool(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "packrat.dev/v1alpha1",
        "kind": "PackratPool",
        "metadata": {"name": name},
        "spec": {"cpus": 1, "memory": "1Gi", "replicas": 1, "weightBudget": "64Mi"},
    }


def _pooled(cluster: OperatorCluster, name: str) -> bool:
    status = cluster.status(name)
    return status.get("phase") == "Ready" and (status.get("pool") or {}).get("pod") == "pool-0"


def _move_under_load(
    cluster: OperatorCluster,
    pool: str | None,
    done: Callable[[], bool],
    *,
    then: Callable[[], None] | None = None,
) -> None:
    """Set pb's spec.pool to ``pool`` while clients call it, wait for ``done`` and ten more
    answers; not one request may fail."""
    with Load(cluster, "pb", "pb") as load:
        wait_for(lambda: len(load.results) > 10, timeout=SLOW, what="load warm-up")
        cluster.api.patch("packratmodels", "pb", {"spec": {"pool": pool}})
        if then is not None:
            then()
        wait_for(
            done,
            timeout=SLOW,
            what=f"pb moved (spec.pool {pool})",
            period=0.5,
            detail=lambda: f"status: {cluster.status('pb')}\nlog:\n{cluster.log_tail(30)}",
        )
        moved = time.monotonic()
        wait_for(
            lambda: sum(1 for t, _ in load.results if t > moved) > 10,
            timeout=SLOW,
            what="requests after the move",
        )
    assert not load.failures, load.failures[:5]


def test_pool_hosts_two_models_and_one_moves_out_and_back_while_serving(
    cluster: OperatorCluster, tiny_profiles: MeasuredProfiles
) -> None:
    measuring = threading.Thread(target=tiny_profiles.profile, args=(4,), daemon=True)
    measuring.start()  # for the model moved out: measured while the pool starts
    cluster.api.create("packratpools", _pool(POOL))
    for name in MODELS:
        cluster.api.create("packratmodels", body(name, tiny_spec(4, batchSize=1, pool=POOL)))
    for name in MODELS:
        wait_for(
            lambda name=name: _pooled(cluster, name),
            timeout=SLOW,
            what=f"{name} served by the pool",
            period=0.5,
            detail=lambda: (
                f"pool: {cluster.api.get('packratpools', POOL)}\nlog:\n{cluster.log_tail(30)}"
            ),
        )
    pool = cluster.api.get("packratpools", POOL) or {}
    assert pool["status"]["phase"] == "Serving"
    assert set(pool["status"]["models"]) == set(MODELS)
    assert cluster.condition("pa", "Placed")["status"] == "True"
    # a pooled model has no Deployment of its own; the pool one Deployment per pod
    deployments = {d["metadata"]["name"] for d in cluster.api.list("deployments")}
    assert "pool-0" in deployments and not any(d.startswith("pa-") for d in deployments)
    answers = {}
    for name in MODELS:  # once the proxy's endpoints follow the Service's new selector
        code, answer = wait_for(
            lambda name=name: (got := cluster.predict(name, name))[0] == 200 and got,
            timeout=60,
            what=f"{name} answers through its Service",
        )
        answers[name] = answer
    assert answers["pa"] == answers["pb"]  # the same zoo weights: the same answer
    # issue 38: /pool/status answers only the pool's token (its Secret, mounted read-only)
    status_url = f"{cluster.agent.proxy.url(POOL)}/pool/status"
    assert http_json(status_url)[0] == 401
    token = secret_token(cluster.api.get("secrets", f"{POOL}-pool-token") or {})
    code, doc = http_json(status_url, token=token)
    assert code == 200 and set(MODELS) <= set(doc["models"]), doc
    # each keeps its own profile and plan, made on the pool's cpus (1), not its own (2);
    # the pool pod runs it with the plan's threads once its config has them
    for name in MODELS:
        plan = wait_for(
            lambda name=name: cluster.status(name).get("poolPlan"),
            timeout=SLOW,
            what=f"{name}'s plan on the pool's cpus",
            detail=lambda: f"status: {cluster.status('pa')}\nlog:\n{cluster.log_tail(30)}",
        )
        assert (plan["cpus"], plan["threads"], plan["plan"]["cpus"]) == (1, 1, 1), plan
        key = cluster.status(name)["profile"]["key"]
        pooled = pooled_spec(parse(cluster.model(name), default_image=TEST_IMAGE), 1)
        assert key == pooled.profile_key
    wait_for(
        lambda: http_json(status_url, token=token)[1]["models"]["pa"].get("batch") == 1,
        timeout=SLOW,
        what="the pool pod runs pa with its plan",
    )

    # out of the pool, under load: the pool serves pb until pb's own pods answer
    def own_pods_serve() -> bool:
        status = cluster.status("pb")
        return status.get("phase") == "Ready" and "pool" not in status

    def seed() -> None:  # once its status holds its own profile key, not the pool's
        own = parse(cluster.model("pb"), default_image=TEST_IMAGE).profile_key
        wait_for(
            lambda: (cluster.status("pb").get("profile") or {}).get("key") == own,
            timeout=SLOW,
            what="pb's own profile key",
        )
        seed_profile(cluster, "pb", tiny_profiles.profile(4), timeout=SLOW)

    _move_under_load(cluster, None, own_pods_serve, then=seed)
    svc = cluster.api.get("services", "pb") or {}
    assert "packrat.dev/pool-pod" not in svc["spec"]["selector"]
    code, answer = cluster.predict("pb", "pb")
    assert code == 200 and answer == answers["pb"]
    # the pool lets pb go; pa still answers from it
    wait_for(
        lambda: (
            "pb"
            not in ((cluster.api.get("packratpools", POOL) or {}).get("status") or {}).get(
                "models", {}
            )
        ),
        timeout=SLOW,
        what="the pool lets pb go",
    )
    wait_for(lambda: cluster.predict("pa", "pa")[0] == 200, timeout=SLOW, what="pa answers")

    # back into the pool, under load: its own pods serve until the pool answers for it,
    # and go only after its Service points at the pool pod
    def pooled_alone() -> bool:
        names = [d["metadata"]["name"] for d in cluster.api.list("deployments")]
        return _pooled(cluster, "pb") and not any(n.startswith("pb-") for n in names)

    _move_under_load(cluster, POOL, pooled_alone)

    # a second pool pod: one of the two models moves to it, both answering throughout
    with Load(cluster, "pa", "pa") as load_a, Load(cluster, "pb", "pb") as load_b:
        wait_for(lambda: len(load_a.results) > 10, timeout=SLOW, what="load warm-up")
        cluster.api.patch("packratpools", POOL, {"spec": {"replicas": 2}})

        def split() -> bool:
            pods = {(cluster.status(n).get("pool") or {}).get("pod") for n in MODELS}
            return pods == {"pool-0", "pool-1"}

        wait_for(split, timeout=SLOW, what="the models on two pods", period=0.5)
        moved = time.monotonic()
        wait_for(
            lambda: all(sum(1 for t, _ in x.results if t > moved) > 10 for x in (load_a, load_b)),
            timeout=SLOW,
            what="requests after the split",
        )
    assert not load_a.failures and not load_b.failures, (load_a.failures + load_b.failures)[:5]
