"""The engine contract on every installed engine, with the tiny zoo model: convert once
(cached, reused), load with t threads, run a batch, agree with eager, report memory."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from packrat.runtime import engines
from packrat.runtime.engines import cache, check
from packrat.runtime.engines.onnx_export import sample
from packrat.runtime.engines.prepare import prepare
from packrat.runtime.zoo import load_model, model_digest

FAST = [engines.EAGER, engines.ONNXRUNTIME, engines.OPENVINO]


def _engine_or_skip(name: str) -> engines.Engine:
    engine = engines.engine(name)
    reason = engine.missing()
    if reason is not None:
        pytest.skip(reason)
    return engine


def _artefact(name: str, root: Path) -> cache.Artefact:
    return cache.converted(
        _engine_or_skip(name),
        root=root,
        model_name="tiny",
        digest=model_digest("tiny"),
        inputs=engines.input_specs("tiny"),
        build=lambda: load_model("tiny"),
    )


def _contract(name: str, root: Path) -> None:
    art = _artefact(name, root)
    assert art.converted_now
    assert (art.path is None) == (name == engines.EAGER)
    engine = engines.engine(name)
    model = load_model("tiny")
    runner = engine.load(art.path, model=model, threads=1)
    x = sample(engines.input_specs("tiny"), 4, seed=7)
    out = runner.run(x)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (4, 4)
    eager = engines.engine(engines.EAGER).load(None, model=model, threads=1)
    verdict = check.check_engine(runner, eager, engines.input_specs("tiny"), sample_input=x)
    assert verdict.ok, verdict.reason
    memory = runner.memory()
    assert memory["rss_bytes"] > 0
    if name == engines.OPENVINO:  # OpenVINO maps its IR's weights from the artefact's file
        assert memory["artefact_mapped_bytes"] > 0


@pytest.mark.parametrize("name", FAST)
def test_engine_contract(name: str, tmp_path: Path) -> None:
    _contract(name, tmp_path)


@pytest.mark.slow
def test_inductor_contract(tmp_path: Path) -> None:
    """AOTInductor compiles a C++ library (about 100 s for the tiny model on a busy machine)."""
    _contract(engines.INDUCTOR, tmp_path)


@pytest.mark.parametrize("name", [engines.ONNXRUNTIME, engines.OPENVINO])
def test_the_artefact_is_converted_once_and_reused(name: str, tmp_path: Path) -> None:
    first = _artefact(name, tmp_path)
    assert first.path is not None
    stamp = first.path.stat().st_mtime_ns, first.path.stat().st_ino
    second = _artefact(name, tmp_path)
    assert not second.converted_now
    assert second.path == first.path
    assert (second.path.stat().st_mtime_ns, second.path.stat().st_ino) == stamp
    # keyed by the input specs too: other specs are another artefact
    other = cache.converted(
        engines.engine(name),
        root=tmp_path,
        model_name="tiny",
        digest=model_digest("tiny"),
        inputs=(engines.InputSpec((16,), "float32", 0), engines.InputSpec((16,))),
        build=_TwoInputs,
    )
    assert other.converted_now and other.folder != first.folder


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tiny = load_model("tiny")

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tiny(a + b)
        return out


class _Wrong:
    """An engine runner whose outputs are slightly off (as a miscompiled kernel's would be)."""

    def __init__(self, inner: engines.Runner) -> None:
        self.inner = inner

    def run(self, inputs: object) -> torch.Tensor:
        out = self.inner.run(inputs)  # type: ignore[arg-type]
        assert isinstance(out, torch.Tensor)
        return out * 1.01

    def memory(self) -> dict[str, int]:
        return self.inner.memory()


def test_the_gate_refuses_an_engine_that_disagrees_or_crashes() -> None:
    model = load_model("tiny")
    eager = engines.engine(engines.EAGER).load(None, model=model, threads=1)
    specs = engines.input_specs("tiny")
    verdict = check.check_engine(_Wrong(eager), eager, specs)
    assert not verdict.ok and "max |diff|" in verdict.reason

    class _Crash(_Wrong):
        def run(self, inputs: object) -> torch.Tensor:
            raise RuntimeError("kernel fault")

    crashed = check.check_engine(_Crash(eager), eager, specs)
    assert not crashed.ok and "crashed" in crashed.reason and "kernel fault" in crashed.reason


def test_tolerances_per_dtype() -> None:
    base = torch.tensor([10.0, -10.0])
    assert check.compare(base + 0.005, base).ok  # within 1e-4 + 1e-3 * 10
    assert not check.compare(base + 0.02, base).ok
    assert check.compare(base.half() + 0.05, base.half()).ok  # float16: 1e-2 + 1e-2 * 10
    assert not check.compare(torch.tensor([1, 2]), torch.tensor([1, 3])).ok  # integers: equal
    assert not check.compare(torch.tensor([float("nan")]), torch.tensor([1.0])).ok
    assert not check.compare(torch.zeros(2, 3), torch.zeros(3, 2)).ok


def test_a_missing_extra_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "openvino":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    reason = engines.engine(engines.OPENVINO).missing()
    assert reason is not None and "\n" not in reason and "packrat-operator[openvino]" in reason
    with pytest.raises(engines.EngineMissingError, match=r"openvino package is not installed"):
        engines.parse_engines("eager,openvino")
    # the operator's Job (--missing-engines leave-out): kept, then left out with the reason
    assert engines.parse_engines("eager,openvino", allow_missing=True) == ["eager", "openvino"]
    verdict = prepare("tiny", engines.OPENVINO, tmp_path)
    assert verdict["status"] == "excluded" and verdict["reason"] == reason
    assert not any(tmp_path.iterdir())  # nothing converted
    assert engines.OPENVINO not in engines.installed()
    with pytest.raises(engines.EngineError, match="unknown engine 'tensorrt'"):
        engines.engine("tensorrt")
