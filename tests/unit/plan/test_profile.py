"""Profile files: the JSON format round-trips, CSV imports, and bad files name file and row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from packaging_support import ROOT

from packrat.plan.profile import (
    ALONE,
    COLOCATED,
    FORMAT,
    Profile,
    ProfileError,
    ProfileMeta,
    ProfilePoint,
    load_profile,
    parse_profile,
)

PAPER = ROOT / "benchmarks" / "profiles" / "packrat-paper"


def sample_profile() -> Profile:
    return Profile(
        meta=ProfileMeta(
            model="tiny",
            model_digest="sha256:abc",
            cpu_model="Test CPU",
            cpus=2,
            torch_version="2.13.0",
            created="2026-12-02T00:00:00Z",
        ),
        points=(
            ProfilePoint(1, 1, 1.5, samples=30, p50_ms=1.4, p99_ms=2.0, cv=0.05),
            ProfilePoint(2, 1, 1.0, samples=30, p50_ms=0.9, p99_ms=1.3, cv=0.04),
            ProfilePoint(1, 2, 2.75),
        ),
    )


def test_json_round_trip(tmp_path: Path) -> None:
    profile = sample_profile()
    path = tmp_path / "p.json"
    profile.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT
    loaded = load_profile(path)
    assert loaded.points == tuple(sorted(profile.points, key=lambda p: p.key))
    assert loaded.meta.model == "tiny" and loaded.meta.cpus == 2
    assert loaded.latency(2, 1) == 1.0 and loaded.latency(2, 2) is None


def test_mode_round_trips_and_old_files_read_as_alone() -> None:
    colocated = Profile(
        meta=ProfileMeta(model="tiny", cpus=2, mode=COLOCATED), points=sample_profile().points
    )
    again = parse_profile(colocated.to_json(), origin="v2.json")
    assert again.meta.mode == COLOCATED
    # a v1 file (before co-location) has no mode: its points were measured alone
    v1 = sample_profile().to_dict()
    v1["format"] = "packrat.profile/v1"
    del v1["meta"]["mode"]
    old = parse_profile(json.dumps(v1), origin="v1.json")
    assert old.meta.mode == ALONE and old.table() == sample_profile().table()
    assert parse_profile("threads,batch,latency_ms\n1,1,2.0\n", origin="p.csv").meta.mode == ALONE
    with pytest.raises(ProfileError, match="mode must be one of"):
        Profile(meta=ProfileMeta(mode="mixed"), points=sample_profile().points)


def test_save_creates_missing_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "p.json"
    sample_profile().save(path)
    assert load_profile(path).table() == sample_profile().table()


def test_csv_export_and_import_round_trip(tmp_path: Path) -> None:
    profile = sample_profile()
    path = tmp_path / "p.csv"
    profile.save(path)
    assert path.read_text().splitlines()[0] == "threads,batch,latency_ms"
    assert load_profile(path).table() == profile.table()


@pytest.mark.parametrize("name", ["resnet-pytorch.csv", "bert-torchserve.csv"])
def test_imports_the_papers_csv(name: str) -> None:
    assert (PAPER / name).exists(), f"{PAPER / name}: shipped with the repository"
    profile = load_profile(PAPER / name)
    assert profile.meta.cpus == 16
    assert profile.threads == list(range(1, 17))
    assert profile.batches[0] == 1
    assert all(p.latency_ms > 0 for p in profile.points)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("threads,batch\n1,1\n", "line 1: missing column\\(s\\) latency_ms"),
        ("threads,batch,latency_ms\n1,1,5\n1,1,6\n", "line 3: duplicate point .*first on line 2"),
        ("threads,batch,latency_ms\n1,1,0\n", "line 2: .*latency_ms must be a finite number > 0"),
        ("threads,batch,latency_ms\n1,1,-3\n", "line 2: .*latency_ms must be"),
        ("threads,batch,latency_ms\n1,2,nan\n", "line 2: .*latency_ms must be"),
        ("threads,batch,latency_ms\n1,x,2\n", "line 2: batch must be an integer"),
        ("threads,batch,latency_ms\n0,1,2\n", "line 2: .*threads must be an integer >= 1"),
        ("threads,batch,latency_ms\n1,1\n", "line 2: expected 3 columns"),
        ("threads,batch,latency_ms\n", "no points"),
        ("", "empty file"),
    ],
)
def test_bad_csv_names_file_and_row(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="packrat.profile/v0"), "unsupported profile format"),
        (lambda d: d["points"].append(dict(d["points"][0])), "point 4 .*duplicate of point 1"),
        (lambda d: d["points"][1].update(latency_ms=math.nan), "latency_ms must be a finite"),
        (lambda d: d["points"][0].pop("batch"), "point 1: missing batch"),
        (lambda d: d["meta"].update(colour="red"), "unknown meta fields"),
        (lambda d: d["meta"].update(mode="mixed"), "mode must be one of co-located, alone"),
        (lambda d: d.update(format="packrat.profile/v1"), r"unknown meta fields \['mode'\]"),
        (lambda d: d.update(points=[]), "no points"),
    ],
)
def test_bad_json_is_a_clear_error(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = sample_profile().to_dict()
    mutate(data)
    with pytest.raises(ProfileError, match=message):
        parse_profile(json.dumps(data), origin="x.json")


def test_invalid_json_reports_line() -> None:
    with pytest.raises(ProfileError, match="x.json: invalid JSON at line 2"):
        parse_profile('{\n"format": }', origin="x.json")


def test_missing_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.json")
