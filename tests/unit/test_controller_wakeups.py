"""A watch reconnect re-lists every child; only news wakes a model."""

from __future__ import annotations

from packrat.controller.handlers import OperatorOptions, Wakeups, next_delay


def _meta(uid: str, version: str) -> dict[str, str]:
    return {"uid": uid, "resourceVersion": version, "name": uid}


def test_unchanged_relisting_wakes_nobody() -> None:
    w = Wakeups()
    assert w.changed(_meta("d1", "5"), "ADDED")
    assert not w.changed(_meta("d1", "5"), None)  # re-listed after a reconnect, same version
    assert w.changed(_meta("d1", "6"), None)  # changed while the watch was down
    assert not w.changed(_meta("d1", "6"), None)
    assert w.changed(_meta("d2", "1"), None)  # new while the watch was down
    assert not w.changed(_meta("d1", "6"), "ADDED")  # a replaying watch, same version
    assert w.changed(_meta("d1", "6"), "MODIFIED")  # a modification always counts


def test_deleted_child_is_forgotten() -> None:
    w = Wakeups()
    w.changed(_meta("d1", "5"), "ADDED")
    assert w.changed(_meta("d1", "5"), "DELETED")
    assert w.changed(_meta("d1", "5"), None)  # recreated under the same uid: news again
    assert w.changed({"name": "no-version"}, None)  # nothing to compare: wake


def test_memory_is_bounded() -> None:
    w = Wakeups()
    w.MAX_SEEN = 3
    for i in range(10):
        w.changed(_meta(f"d{i}", "1"), "ADDED")
    assert len(w._seen) <= 3


def test_autobatch_model_at_rest_is_sampled_not_left_to_the_resync() -> None:
    opts = OperatorOptions(resync_seconds=300, poll_seconds=2, estimate_seconds=5)
    rest = {"waiting": False, "tuning": None}
    assert next_delay(opts, wants_estimates=False, **rest) == 300  # idle: the resync only
    assert next_delay(opts, wants_estimates=True, **rest) == 5  # autoBatch: an observation
    assert next_delay(opts, waiting=True, wants_estimates=True, tuning=None) == 2
    assert next_delay(opts, waiting=False, wants_estimates=True, tuning=1.5) == 1.5
    assert next_delay(opts, waiting=False, wants_estimates=False, tuning=30) == 30
