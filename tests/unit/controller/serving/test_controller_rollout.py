"""deployment_ready: a slot counts as ready only when its rollout is complete, as
``kubectl rollout status`` judges it (generation observed, every wanted pod of the current
template ready, no pod of an older template left)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from packrat.controller.serving.slots import deployment_ready


def _dep(
    *, replicas: int, total: int, updated: int, ready: int, generation: int = 2, observed: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
        },
    }


def test_re_rendered_slot_with_its_old_pod_still_ready_is_not_ready() -> None:
    # the passive slot got a new template (its pod unschedulable) while the old pod still runs
    # and is ready: readyReplicas 1 is the old pod's
    assert not deployment_ready(_dep(replicas=1, total=2, updated=1, ready=1), 1)
    # once the old pod is gone and the new one ready, it is
    assert deployment_ready(_dep(replicas=1, total=1, updated=1, ready=1), 1)


def test_unobserved_generation_and_other_replica_counts() -> None:
    assert not deployment_ready(_dep(replicas=1, total=1, updated=1, ready=1, observed=1), 1)
    assert not deployment_ready(_dep(replicas=2, total=2, updated=2, ready=2), 1)
    assert deployment_ready(_dep(replicas=0, total=0, updated=0, ready=0), 0)
    assert not deployment_ready(None, 1)
    # a status without the optional counts (older API servers): ready alone decides
    dep = _dep(replicas=1, total=1, updated=1, ready=1)
    dep["status"] = {"observedGeneration": 2, "readyReplicas": 1}
    assert deployment_ready(dep, 1)


@given(
    replicas=st.integers(1, 4),
    total=st.integers(0, 8),
    updated=st.integers(0, 8),
    ready=st.integers(0, 8),
)
def test_matches_rollout_status(replicas: int, total: int, updated: int, ready: int) -> None:
    """Against the rule spelled out: complete iff the new template has every wanted pod,
    all wanted pods are ready, and nothing else runs."""
    want = updated >= replicas and ready >= replicas and total <= updated
    got = deployment_ready(
        _dep(replicas=replicas, total=total, updated=updated, ready=ready), replicas
    )
    assert got == want
