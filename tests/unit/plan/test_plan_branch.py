"""Branch conditions (issue 27 item 5): parsing, deciding on headers and JSON answers
(against a direct comparison), hostile answers, and measured fractions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.plan.pipeline.branch import (
    MAX_JSON_BYTES,
    Condition,
    measured_fractions,
    parse_condition,
    taken,
)
from packrat.plan.pipeline.simulate import PipelineError

JSON = "application/json"


def decide(cond: Condition, doc: object, headers: dict[str, str] | None = None) -> bool:
    return taken(cond, headers=headers or {}, body=json.dumps(doc).encode(), content_type=JSON)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from(["below", "above"]),
)
def test_thresholds_match_a_direct_comparison(value: float, limit: float, test: str) -> None:
    cond = parse_condition({"json": "a.b", test: limit})
    expected = value < limit if test == "below" else value > limit
    assert decide(cond, {"a": {"b": value}}) is expected


def test_equals_on_json_and_headers() -> None:
    assert decide(parse_condition({"json": "label", "equals": "cat"}), {"label": "cat"})
    assert not decide(parse_condition({"json": "label", "equals": "cat"}), {"label": "dog"})
    assert decide(parse_condition({"json": "unsure", "equals": True}), {"unsure": True})
    assert not decide(parse_condition({"json": "unsure", "equals": True}), {"unsure": 1})
    assert decide(parse_condition({"json": "k", "equals": 2}), {"k": 2.0})
    assert decide(parse_condition({"json": "top.0.score", "above": 0.5}), {"top": [{"score": 0.9}]})
    header = parse_condition({"header": "X-Unsure", "equals": "true"})
    assert taken(header, headers={"x-unsure": " true"}, body=b"")
    assert not taken(header, headers={"x-unsure": "false"}, body=b"")
    assert not taken(header, headers={}, body=b"")
    assert Condition(json=("a", "b"), below=1.0).to_doc() == {"json": "a.b", "below": 1.0}


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"a": "x"}', b'{"b": 1}', b"[1, 2]", b'{"a": true}', b'"a"', b"{" * 5000],
)
def test_hostile_or_odd_answers_do_not_take_the_edge(body: bytes) -> None:
    cond = parse_condition({"json": "a", "below": 10})
    assert taken(cond, headers={}, body=body, content_type=JSON) is False


def test_a_huge_or_non_json_answer_is_not_parsed() -> None:
    cond = parse_condition({"json": "a", "below": 10})
    big = json.dumps({"a": 1, "pad": "x" * MAX_JSON_BYTES}).encode()
    assert not taken(cond, headers={}, body=big, content_type=JSON)
    assert not taken(cond, headers={}, body=b'{"a": 1}', content_type="image/png")
    assert taken(cond, headers={}, body=b'{"a": 1}', content_type="")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("x", "expected a mapping"),
        ({"json": "a"}, "exactly one of equals, below and above"),
        ({"json": "a", "header": "h", "equals": 1}, "exactly one of header and json"),
        ({"json": "a", "below": "1"}, "expected a number"),
        ({"json": "a..b", "below": 1}, "dotted field path"),
        ({"header": "h", "below": 1}, "equals only"),
        ({"header": "h", "equals": 1}, "as a string"),
        ({"json": "a", "equals": [1]}, "string, number or boolean"),
        ({"json": "a", "below": 1, "extra": 2}, "unknown field"),
    ],
)
def test_bad_conditions_are_refused(doc: object, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        parse_condition(doc)


def test_measured_fractions() -> None:
    got = measured_fractions({("a", "b"): 30.0, ("a", "c"): 0.0, ("x", "y"): 5.0}, {"a": 120.0})
    assert got == {("a", "b"): 0.25, ("a", "c"): 0.0}
