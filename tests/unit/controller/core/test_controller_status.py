"""Phase machine and condition bookkeeping."""

from __future__ import annotations

from packrat.controller.core.status import (
    Facts,
    derive_phase,
    get_condition,
    is_true,
    parse_time,
    set_condition,
)


def test_condition_transition_time_moves_only_on_flip() -> None:
    conds = set_condition(
        [], type_="Ready", status=False, reason="Deploying", now="t1", generation=1
    )
    conds = set_condition(
        conds, type_="Ready", status=False, reason="Waiting", message="m", now="t2"
    )
    ready = get_condition(conds, "Ready")
    assert ready is not None
    assert ready["lastTransitionTime"] == "t1"
    assert ready["reason"] == "Waiting" and ready["message"] == "m"
    conds = set_condition(conds, type_="Ready", status=True, reason="Ready", now="t3", generation=2)
    ready = get_condition(conds, "Ready")
    assert ready is not None
    assert ready["lastTransitionTime"] == "t3"
    assert ready["observedGeneration"] == 2
    assert is_true(conds, "Ready")


def test_conditions_are_ordered_and_independent() -> None:
    conds = set_condition([], type_="Ready", status=True, reason="R", now="t")
    conds = set_condition(conds, type_="Profiled", status=True, reason="P", now="t")
    assert [c["type"] for c in conds] == ["Profiled", "Ready"]
    assert not is_true(conds, "Degraded")


def test_bad_status_rejected() -> None:
    try:
        set_condition([], type_="Ready", status="Maybe", reason="R")
    except ValueError:
        return
    raise AssertionError("expected ValueError")


def test_phase_machine() -> None:
    assert derive_phase(Facts()) == "Pending"
    assert derive_phase(Facts(profiling=True)) == "Profiling"
    assert derive_phase(Facts(profiled=True)) == "Planning"
    assert derive_phase(Facts(profiled=True, planned=True)) == "Deploying"
    assert (
        derive_phase(Facts(profiled=True, planned=True, deployed=True, ready_replicas=0))
        == "Deploying"
    )
    assert (
        derive_phase(Facts(profiled=True, planned=True, deployed=True, ready_replicas=1)) == "Ready"
    )
    assert (
        derive_phase(
            Facts(profiled=True, planned=True, deployed=True, ready_replicas=1, switching=True)
        )
        == "Reconfiguring"
    )
    assert derive_phase(Facts(invalid=True, profiled=True)) == "Failed"
    assert derive_phase(Facts(failed=True)) == "Failed"
    assert derive_phase(Facts(profiled=True, planned=True, deployed=True, replicas=0)) == "Ready"


def test_parse_time() -> None:
    t = parse_time("2026-01-02T03:04:05Z")
    assert t is not None and t.year == 2026 and t.tzinfo is not None
    assert parse_time("nonsense") is None
    assert parse_time(None) is None
