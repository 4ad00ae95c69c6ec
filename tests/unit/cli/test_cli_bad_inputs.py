"""Every bad file the CLI reads is one line on stderr naming the file, and exit status 2.

Each case here was a traceback (or an out-of-memory) before; the fuzz tests check that the
profile and plan parsers raise their own error types and nothing else, for any input.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrat.cli import main
from packrat.plan.optimizer import Plan, PlanError
from packrat.plan.profile import ProfileError, parse_profile

POINTS = [{"threads": t, "batch": b, "latency_ms": 1.0 + t * b} for t in (1, 2) for b in (1, 2)]


def _profile(meta: dict[str, Any] | None = None, points: Any = None) -> str:
    doc: dict[str, Any] = {"format": "packrat.profile/v1", "points": points or POINTS}
    if meta is not None:
        doc["meta"] = meta
    return json.dumps(doc)


GOOD_PLAN = {
    "cpus": 2,
    "batch": 4,
    "expected_latency_ms": 3.0,
    "instances": [{"threads": 1, "batch": 2, "count": 2, "latency_ms": 3.0}],
}

PROFILE_CASES: dict[str, tuple[bytes, list[str]]] = {
    "non-utf8-csv": (b"threads,batch,latency_ms\n1,1,\xff\xfe\n", ["--batch", "2"]),
    "nul-in-csv": (b"threads,batch,latency_ms\n1,1,2\x00\n", ["--batch", "2"]),
    "deep-json": (b"{" + b'"a":[' * 100_000 + b"]" * 100_000 + b"}", ["--batch", "2"]),
    "huge-int-json": (b'{"format": ' + b"9" * 5000 + b"}", ["--batch", "2"]),
    "threads-1e20": (
        _profile(points=[{"threads": 1e20, "batch": 1, "latency_ms": 1.0}]).encode(),
        ["--batch", "1", "--cpus", "2"],
    ),
    "threads-1e20-csv": (
        b"threads,batch,latency_ms\n100000000000000000000,1,2\n",
        ["--batch", "1"],
    ),
    "meta-cpus-1e300": (_profile(meta={"cpus": 1e300}).encode(), ["--batch", "2"]),
    "meta-model-not-a-string": (_profile(meta={"model": [1]}).encode(), ["--batch", "2"]),
    "latency-a-list": (
        _profile(points=[{"threads": 1, "batch": 1, "latency_ms": [1]}]).encode(),
        ["--batch", "1"],
    ),
    "no-meta-cpus-extrapolated": (_profile().encode(), ["--batch", "2", "--cpus", "1000000"]),
}


@pytest.mark.parametrize("case", sorted(PROFILE_CASES))
def test_bad_profiles_are_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, extra = PROFILE_CASES[case]
    path = tmp_path / (f"{case}.csv" if case.endswith("csv") else f"{case}.json")
    path.write_bytes(data)
    assert main(["plan", "--profile", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err[:2000]
    assert "Traceback" not in err and len(err) < 500
    if case != "no-meta-cpus-extrapolated":
        assert str(path) in err
    else:
        assert "exceeds the 2 cores" in err


def test_plot_into_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(_profile(meta={"cpus": 2}))
    target = tmp_path / "missing" / "plot.png"
    assert main(["plan", "--profile", str(path), "--batch", "2", "--plot", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(target) in err and "does not exist" in err


def test_a_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, refused: Callable[[list[str], str], str]
) -> None:
    # under a plain file: no command gets as far as torch or a conversion, nor a traceback
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    argv = ["convert", "--model", "tiny", "--engines", "onnxruntime"]
    err = refused([*argv, "--artefacts", str(blocked / "artefacts")], str(blocked))
    assert "Not a directory" in err


PLAN_CASES: dict[str, Any] = {
    "instances-not-objects": {**GOOD_PLAN, "instances": [1, 2]},
    "instances-a-string": {**GOOD_PLAN, "instances": "2x1t"},
    "latency-a-string": {**GOOD_PLAN, "expected_latency_ms": "fast"},
    "latency-nan": {**GOOD_PLAN, "expected_latency_ms": math.nan},
    "instance-latency-nan": {
        **GOOD_PLAN,
        "instances": [{"threads": 1, "batch": 2, "count": 2, "latency_ms": math.nan}],
    },
    "instance-latency-string": {
        **GOOD_PLAN,
        "instances": [{"threads": 1, "batch": 2, "count": 2, "latency_ms": "3"}],
    },
    "fat-nan": {**GOOD_PLAN, "fat_latency_ms": math.nan},
    "alternatives-a-list": {**GOOD_PLAN, "alternatives": [1]},
    "alternative-not-object": {**GOOD_PLAN, "alternatives": {"fat": 3}},
    "cpus-1e300": {**GOOD_PLAN, "cpus": 10**300},
    "a-list": [GOOD_PLAN],
}


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_bad_plan_files_are_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(PLAN_CASES[case]))
    assert main(["serve", "--model", "tiny", "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe{}", b"[" * 100_000, b'{"cpus": ' + b"7" * 5000 + b"}"], ids=str
)
def test_unreadable_plan_text(
    raw: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(raw)
    assert main(["serve", "--model", "tiny", "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["packrat.profile/v1", "1", "2.5", "nan"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "format",
                    "meta",
                    "points",
                    "threads",
                    "batch",
                    "latency_ms",
                    "cpus",
                    "count",
                    "instances",
                    "expected_latency_ms",
                    "alternatives",
                    "model",
                    "samples",
                    "p50_ms",
                    "extra",
                ]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(doc=json_values)
def test_fuzz_profile_parsing_raises_only_profile_errors(doc: Any) -> None:
    for text in (json.dumps(doc), "{" + json.dumps(doc)[1:] if isinstance(doc, dict) else "{"):
        with contextlib.suppress(ProfileError):
            parse_profile(text, origin="fuzz")


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet='threads,batchlatency_ms0123456789.-e\n\r"\x00 nai', max_size=120))
def test_fuzz_csv_profiles_raise_only_profile_errors(text: str) -> None:
    with contextlib.suppress(ProfileError):
        parse_profile("threads,batch,latency_ms\n" + text, origin="fuzz.csv")


@settings(max_examples=300, deadline=None)
@given(doc=json_values)
def test_fuzz_plan_parsing_raises_only_plan_errors(doc: Any) -> None:
    with contextlib.suppress(PlanError):
        Plan.from_dict(doc)


@settings(max_examples=200, deadline=None)
@given(
    instances=st.lists(
        st.fixed_dictionaries(
            {"threads": json_values | st.integers(1, 4), "batch": st.integers(1, 4)}
        ),
        max_size=3,
    ),
    cpus=json_values | st.integers(1, 8),
    batch=json_values | st.integers(1, 8),
    latency=json_values | st.floats(),
)
def test_fuzz_plan_shapes(instances: Any, cpus: Any, batch: Any, latency: Any) -> None:
    doc = {"cpus": cpus, "batch": batch, "expected_latency_ms": latency, "instances": instances}
    try:
        plan = Plan.from_dict(doc)
    except PlanError:
        return
    assert math.isfinite(plan.expected_latency_ms) and plan.total_threads <= plan.cpus
