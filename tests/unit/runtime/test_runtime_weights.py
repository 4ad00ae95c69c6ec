"""The pod's weight store: saved once, mapped read-only by every instance, never copied."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from packrat.runtime import weights, zoo


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    return weights.export("tiny", weights.weights_path(tmp_path, "tiny"))


def test_round_trip_gives_the_zoo_model_exactly(tiny_file: Path) -> None:
    reference = zoo.load_model("tiny")
    shared = weights.load_shared("tiny", tiny_file)
    ref_state, got_state = reference.state_dict(), shared.state_dict()
    assert ref_state.keys() == got_state.keys()
    for name, tensor in ref_state.items():
        assert torch.equal(tensor, got_state[name]), name
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(reference(x), shared(x))
    assert not shared.training
    assert not any(p.requires_grad for p in shared.parameters())


def test_every_tensor_lies_inside_the_mapped_file(tiny_file: Path) -> None:
    shared = weights.load_shared("tiny", tiny_file)
    got = weights.mapped_bytes(shared, tiny_file)
    assert got.total > 0
    assert got.mapped == got.total
    assert got.fraction == 1.0


def test_a_normally_built_model_is_not_mapped(tiny_file: Path) -> None:
    got = weights.mapped_bytes(zoo.load_model("tiny"), tiny_file)
    assert got.mapped == 0 and got.total > 0


def test_two_loads_share_the_same_file_pages(tiny_file: Path) -> None:
    a = weights.load_shared("tiny", tiny_file)
    b = weights.load_shared("tiny", tiny_file)
    # Two mappings of one file (one per load, as in two workers): same bytes, no copy made.
    assert weights.mapped_bytes(a, tiny_file).fraction == 1.0
    assert weights.mapped_bytes(b, tiny_file).fraction == 1.0
    assert torch.equal(a.net[0].weight, b.net[0].weight)


def test_mapped_bytes_reads_the_maps_format(tmp_path: Path) -> None:
    model = zoo.load_model("tiny")
    first = next(iter(model.parameters())).untyped_storage()
    lo = first.data_ptr()
    fake = tmp_path / "w.pt"
    fake.write_bytes(b"x")
    maps = f"{lo:x}-{lo + first.nbytes():x} r--p 00000000 00:00 0 {fake}\n"
    got = weights.mapped_bytes(model, fake, maps=maps)
    assert got.mapped == first.nbytes()
    assert 0 < got.fraction < 1


def test_torchscript_weights_are_swapped_for_mapped_ones(tmp_path: Path) -> None:
    script = tmp_path / "tiny.pt"
    zoo.save_torchscript(zoo.tiny(), script, inputs=[((16,), torch.float32)])
    path = weights.export(str(script), weights.weights_path(tmp_path, str(script)))
    shared = weights.load_shared(str(script), path)
    assert weights.mapped_bytes(shared, path).fraction == 1.0
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(zoo.tiny()(x), shared(x))


def test_a_file_for_another_model_is_refused(tmp_path: Path, tiny_file: Path) -> None:
    other = tmp_path / "other.pt"
    torch.save({"w": torch.zeros(2)}, other)
    with pytest.raises(weights.WeightsError, match="does not match"):
        weights.load_shared("tiny", other)


def test_a_missing_or_broken_file_is_a_weights_error(tmp_path: Path) -> None:
    with pytest.raises(weights.WeightsError):
        weights.load_shared("tiny", tmp_path / "absent.pt")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a zip")
    with pytest.raises(weights.WeightsError):
        weights.load_shared("tiny", broken)


def test_the_path_changes_with_the_model(tmp_path: Path) -> None:
    assert weights.weights_path(tmp_path, "tiny") == weights.weights_path(tmp_path, "zoo:tiny")
    assert weights.weights_path(tmp_path, "tiny") != weights.weights_path(tmp_path, "resnet50")


def test_the_command_writes_the_file_and_rejects_bad_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.pt"
    assert weights.main(["tiny", str(out)]) == 0
    assert weights.load_shared("tiny", out) is not None
    assert weights.main(["no-such-model", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("packrat weights: error:")
    assert not (tmp_path / "x.pt").exists()


def test_a_model_built_frozen_and_saved_later_maps_back_as_itself(tmp_path: Path) -> None:
    # The native zygote's path: build (kept in memory, shared by fork), save behind.
    built = weights.build_frozen("tiny")
    assert not built.training and not any(p.requires_grad for p in built.parameters())
    assert weights.mapped_bytes(built, tmp_path / "none.pt").fraction == 0.0
    path = weights.save(built, weights.weights_path(tmp_path, "tiny"))
    shared = weights.load_shared("tiny", path)
    assert weights.mapped_bytes(shared, path).fraction == 1.0
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(built(x), shared(x))
        assert torch.equal(zoo.load_model("tiny")(x), shared(x))


def test_a_killed_writers_temporary_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    """A writer killed mid-write leaves its temporary file; the next save removes those not
    written to for STALE_TMP_SECONDS (a live writer's is kept), so crashes cannot fill the
    volume."""
    import os
    import time

    path = tmp_path / "tiny.pt"
    stale, live = tmp_path / "tiny.ptabc.tmp", tmp_path / "tiny.ptdef.tmp"
    other = tmp_path / "other.ptabc.tmp"  # another file's: not ours to judge
    for f in (stale, live, other):
        f.write_bytes(b"partial")
    old = time.time() - weights.STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    import fcntl

    with live.open("rb") as writing:  # a live writer holds its file's lock (issue 38)
        fcntl.flock(writing, fcntl.LOCK_EX)
        weights.save(torch.nn.Linear(2, 2), path)
    assert path.exists() and live.exists() and other.exists()
    assert not stale.exists()
