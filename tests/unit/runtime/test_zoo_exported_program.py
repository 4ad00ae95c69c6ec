"""A torch.export program (.pt2) is a model file Packrat takes: loaded, its inputs known from
its example inputs, profiled; a corrupt one is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from packrat.plan.profile import load_profile
from packrat.profiler.profiler import ProfileSettings, run_profile
from packrat.runtime import engines
from packrat.runtime.zoo import (
    ZooError,
    example_input,
    input_spec,
    load_model,
    model_digest,
)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = load_model("tiny")
    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(model, (example_input("tiny", 4),), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("pt2") / "tiny.pt2"
    torch.export.save(exported, str(path))
    return path


def test_a_pt2_loads_with_its_inputs_known(program: Path) -> None:
    assert input_spec(str(program)) == [{"shape": [16], "dtype": "float32", "high": 0}]
    model = load_model(str(program))
    assert not model.training
    x = example_input(str(program), 3)
    assert isinstance(x, torch.Tensor)
    with torch.inference_mode():
        assert torch.allclose(model(x), load_model("tiny")(x))
    assert model_digest(str(program)).startswith("sha256:")


def test_a_pt2_is_profiled_and_converted(program: Path, tmp_path: Path) -> None:
    names = ["eager"] + [e for e in ("onnxruntime",) if engines.engine(e).missing() is None]
    run_profile(
        spec=str(program),
        cpus=1,
        max_batch=2,
        output=tmp_path / "p.json",
        threads=[1],
        settings=ProfileSettings(
            precision=0.3, point_budget_s=1.0, min_samples=3, verify=False, allow_contended=True
        ),
        allowed=[0],
        engines=names,
        artefacts=tmp_path / "artefacts",
    )
    profile = load_profile(tmp_path / "p.json")
    assert profile.engines == names and profile.meta.model == "tiny"


def test_a_corrupt_pt2_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip archive")
    with pytest.raises(ZooError, match=r"not a loadable torch.export program") as info:
        load_model(str(bad))
    assert "\n" not in str(info.value)
