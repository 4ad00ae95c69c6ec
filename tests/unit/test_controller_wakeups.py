"""A watch reconnect re-lists every child; only news wakes a model."""

from __future__ import annotations

from packrat.controller.handlers import Wakeups


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
