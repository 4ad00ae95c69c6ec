"""The spec is parsed once per pass: the daemon's parse of the watch event's body is used by
the pass when the object it reads is the same (``core.model.Parsed``, ``parse_again``)."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from packrat.controller.core import model as core_model
from packrat.controller.core.model import Parsed, parse_again

OBJ: dict[str, Any] = {
    "apiVersion": "packrat.dev/v1alpha1",
    "kind": "PackratModel",
    "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 3},
    "spec": {"model": {"zoo": "tiny"}, "cpus": 2, "batchSize": 4, "profiling": {"maxBatch": 8}},
}


def test_the_same_object_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    known = Parsed.of(kopf.Body(copy.deepcopy(OBJ)), default_image="img")  # kopf's view
    calls: list[int] = []
    real = core_model.parse
    monkeypatch.setattr(core_model, "parse", lambda *a, **k: calls.append(1) or real(*a, **k))
    fetched = {**copy.deepcopy(OBJ), "status": {"phase": "Ready"}}  # the pass's own GET
    assert parse_again(fetched, default_image="img", known=known) is known.model
    assert calls == []
    for changed in (
        {**OBJ, "spec": {**OBJ["spec"], "batchSize": 2}},
        {**OBJ, "metadata": {**OBJ["metadata"], "generation": 4}},
        {**OBJ, "metadata": {**OBJ["metadata"], "annotations": {"a": "b"}}},
    ):
        again = parse_again(changed, default_image="img", known=known)
        assert again is not known.model
    assert parse_again(OBJ, default_image="other", known=known) is not known.model
    assert len(calls) == 4
    assert parse_again(OBJ, default_image="img").cpus == 2  # nothing known: parsed
