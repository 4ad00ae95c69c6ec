"""Profiling several engines (real worker processes, the tiny model): each engine converted
once and reused by a second profile, checked against eager, and an engine that disagrees or
crashes left out of the profile, with its reason, so that no plan can use it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from packrat.plan.optimizer import Optimizer
from packrat.plan.profile import ENGINES_KEY
from packrat.profiler.client import ForkedWorkers
from packrat.profiler.profiler import ProfileSettings, run_profile
from packrat.runtime import engines
from packrat.runtime.engines.prepare import FAULT_ENV

QUICK = ProfileSettings(
    precision=0.3, point_budget_s=1.0, warmup=1, min_samples=3, verify=False, allow_contended=True
)


def _need(*names: str) -> None:
    for name in names:
        reason = engines.engine(name).missing()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="module")
def eager() -> Iterator[ForkedWorkers]:
    """One eager fork server (a torch import and a model build, seconds of CPU) for every
    profile in this module: each profile's eager points fork from it, as a caller's given
    source (run_profile leaves it open); the engines under test get their own, as always."""
    source = ForkedWorkers("tiny")
    try:
        yield source
    finally:
        source.close()


def _profile(
    output: Path, artefacts: Path, names: tuple[str, ...], eager: ForkedWorkers
) -> dict[str, object]:
    run = run_profile(
        spec="tiny",
        cpus=1,
        max_batch=2,
        output=output,
        threads=[1],
        settings=QUICK,
        allowed=[0],
        engines=names,
        artefacts=artefacts,
        source=eager,
    )
    assert run.profile is not None
    return json.loads(output.read_text())


@dataclass(frozen=True)
class OnnxProfile:
    """One eager + onnxruntime profile, converted from scratch, shared by the tests that
    read it (a profile with a conversion is about a minute of CPU on a loaded machine)."""

    path: Path
    artefacts: Path
    doc: dict[str, object]


@pytest.fixture(scope="module")
def onnx_profile(tmp_path_factory: pytest.TempPathFactory, eager: ForkedWorkers) -> OnnxProfile:
    _need(engines.ONNXRUNTIME)
    folder = tmp_path_factory.mktemp("onnx-profile")
    path, artefacts = folder / "a.json", folder / "artefacts"
    return OnnxProfile(path, artefacts, _profile(path, artefacts, ("eager", "onnxruntime"), eager))


def test_converted_once_and_reused_by_a_second_profile(
    onnx_profile: OnnxProfile, tmp_path: Path, eager: ForkedWorkers
) -> None:
    artefacts, first = onnx_profile.artefacts, onnx_profile.doc
    record = first["meta"]["extra"][ENGINES_KEY]["onnxruntime"]  # type: ignore[index]
    assert record["status"] == "ok" and record["converted_now"] is True
    onnx = Path(record["artefact"]["path"])
    stamp = (onnx.stat().st_mtime_ns, onnx.stat().st_ino)
    points = first["points"]
    assert {p.get("engine", "eager") for p in points} == {"eager", "onnxruntime"}  # type: ignore[union-attr]

    second = _profile(tmp_path / "b.json", artefacts, ("eager", "onnxruntime"), eager)
    again = second["meta"]["extra"][ENGINES_KEY]["onnxruntime"]  # type: ignore[index]
    assert again["converted_now"] is False and again["artefact"]["path"] == str(onnx)
    assert (onnx.stat().st_mtime_ns, onnx.stat().st_ino) == stamp  # not rewritten
    assert len(list(artefacts.rglob("artefact.json"))) == 1


@pytest.mark.parametrize("fault", ["wrong", "crash"])
def test_an_engine_that_disagrees_or_crashes_is_never_planned(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eager: ForkedWorkers
) -> None:
    _need(engines.OPENVINO)
    monkeypatch.setenv(FAULT_ENV, f"openvino:{fault}")
    doc = _profile(tmp_path / "p.json", tmp_path / "artefacts", ("eager", "openvino"), eager)
    record = doc["meta"]["extra"][ENGINES_KEY]["openvino"]  # type: ignore[index]
    assert record["status"] == "excluded"
    assert ("differs from eager" if fault == "wrong" else "injected fault") in record["reason"]
    assert all(p.get("engine", "eager") == "eager" for p in doc["points"])  # type: ignore[union-attr]
    from packrat.plan.profile import load_profile

    profile = load_profile(tmp_path / "p.json")
    optimizer = Optimizer.for_profile(profile, cpus=1, max_batch=2)
    assert {optimizer.plan(b).engine for b in (1, 2)} == {"eager"}


def test_plans_are_verified_on_their_engine_against_the_fastest_fat_engine(
    onnx_profile: OnnxProfile,
) -> None:
    from packrat.bench.verify import verify_plans
    from packrat.plan.profile import load_profile

    profile = load_profile(onnx_profile.path)
    record = verify_plans(profile, spec="tiny", cpus=1, batches=[2], repeats=2)
    assert "error" not in record, record
    (result,) = record["results"]
    plan = Optimizer.for_profile(profile, cpus=1, max_batch=2).plan(2)
    assert result["label"] == plan.label and result["plan"].get("engine", "eager") == plan.engine
    assert result["fatMs"] > 0 and result["planMs"] > 0


def test_a_model_through_packrats_handler_runs_eager_said_once(tmp_path: Path) -> None:
    """A zoo model profiled through Packrat's own handler (a sample request given) is
    profiled eager, and the engines asked for are left out with one line (a user's .mar has
    its handler's module converted: tests/integration/test_profiler_mar_engines.py)."""
    import io

    from packrat.profiler.client import HandlerTarget
    from packrat.serve.codec import example_body
    from packrat.serve.torchserve.archive import build_archive

    sample = tmp_path / "sample.bin"
    sample.write_bytes(example_body("tiny"))
    archive = build_archive("tiny", workdir=tmp_path / "archive")
    stream = io.StringIO()
    run = run_profile(
        spec="tiny",
        cpus=1,
        max_batch=1,
        output=tmp_path / "p.json",
        threads=[1],
        settings=QUICK,
        allowed=[0],
        stream=stream,
        handler=HandlerTarget(archive=archive.path, sample_request=sample),
        engines=("eager", "openvino"),
    )
    assert run.profile is not None and run.profile.engines == ["eager"]
    said = [line for line in stream.getvalue().splitlines() if "left out" in line]
    assert said == [
        "engines openvino left out: a model profiled through Packrat's handler "
        "(--sample-request) runs eager; profile it without one"
    ]
