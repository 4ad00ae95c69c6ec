"""Unit tests for packrat.runtime.cpus: cpu lists, cgroup files, topology, core assignment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packrat.runtime.cpus import (
    CoreAssignmentError,
    CpuInfo,
    allowed_cpus,
    assign_cores,
    cgroup_cpus,
    cpu_model,
    format_cpu_list,
    parse_cpu_list,
    read_topology,
)


# -- cpu list syntax -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8", [0, 1, 2, 3, 8]),
        ("5", [5]),
        ("", []),
        ("  2-3 ,0\n", [0, 2, 3]),
        ("0-7:2", [0, 2, 4, 6]),
        ("3,1,3", [1, 3]),
    ],
)
def test_parse_cpu_list(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "0-3:0", "1,,x"])
def test_parse_cpu_list_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid cpu list"):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([0, 1, 2, 3, 8], "0-3,8"), ([], ""), ([7], "7"), ([4, 2, 3, 10, 11], "2-4,10-11")],
)
def test_format_cpu_list(cpus: list[int], text: str) -> None:
    assert format_cpu_list(cpus) == text
    assert parse_cpu_list(format_cpu_list(cpus)) == sorted(set(cpus))


# -- cgroups ---------------------------------------------------------------------------------
def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_effective_cpuset(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    _write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "0-63\n")
    _write(tmp_path, "sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "4-5,40-41\n")
    assert cgroup_cpus(root=tmp_path) == [4, 5, 40, 41]
    assert allowed_cpus(root=tmp_path, affinity=range(64)) == [4, 5, 40, 41]


def test_cgroup_v2_walks_up_to_the_namespace_root(tmp_path: Path) -> None:
    # Without a cgroup namespace the path in /proc/self/cgroup is not mounted inside.
    _write(tmp_path, "proc/self/cgroup", "0::/host/only/path\n")
    _write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "2-3\n")
    assert cgroup_cpus(root=tmp_path) == [2, 3]


def test_cgroup_v1_fallback(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "proc/self/cgroup",
        "4:memory:/x\n3:cpuset:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
    )
    _write(tmp_path, "sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "6-7\n")
    assert cgroup_cpus(root=tmp_path) == [6, 7]


def test_cgroup_v1_uses_cpuset_cpus_when_effective_missing(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "3:cpuset:/a\n")
    _write(tmp_path, "sys/fs/cgroup/cpuset/a/cpuset.cpus", "1\n")
    assert cgroup_cpus(root=tmp_path) == [1]


def test_hybrid_prefers_v2_when_it_has_a_cpuset(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "3:cpuset:/\n0::/\n")
    _write(tmp_path, "sys/fs/cgroup/unified/cpuset.cpus.effective", "1-2\n")
    _write(tmp_path, "sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-3\n")
    assert cgroup_cpus(root=tmp_path) == [1, 2]


def test_no_cgroup_falls_back_to_affinity(tmp_path: Path) -> None:
    assert cgroup_cpus(root=tmp_path) is None
    assert allowed_cpus(root=tmp_path, affinity=[3, 1]) == [1, 3]


def test_allowed_is_intersection_with_affinity(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/cgroup", "0::/\n")
    _write(tmp_path, "sys/fs/cgroup/cpuset.cpus.effective", "0-7\n")
    assert allowed_cpus(root=tmp_path, affinity=[2, 3, 9]) == [2, 3]
    # an inconsistent view (empty intersection) trusts the scheduler
    assert allowed_cpus(root=tmp_path, affinity=[9]) == [9]


def test_allowed_cpus_on_this_machine_is_within_affinity() -> None:
    cpus = allowed_cpus()
    assert cpus
    assert set(cpus) <= os.sched_getaffinity(0)


# -- topology and cpu model ------------------------------------------------------------------
def test_read_topology_from_sysfs(tmp_path: Path) -> None:
    for cpu, core, socket in [(0, 0, 0), (1, 1, 0), (2, 0, 0), (3, 1, 0), (4, 0, 1)]:
        _write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", f"{core}\n")
        _write(
            tmp_path,
            f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id",
            f"{socket}\n",
        )
    topo = read_topology([4, 0, 2], root=tmp_path)
    assert topo == [CpuInfo(0, 0, 0), CpuInfo(2, 0, 0), CpuInfo(4, 0, 1)]


def test_read_topology_safe_defaults(tmp_path: Path) -> None:
    topo = read_topology([0, 1], root=tmp_path)
    assert [t.socket for t in topo] == [0, 0]
    assert topo[0].core != topo[1].core


def test_cpu_model(tmp_path: Path) -> None:
    _write(tmp_path, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Intel(R)  Xeon(R) X\n")
    assert cpu_model(root=tmp_path) == "Intel(R) Xeon(R) X"
    assert cpu_model()  # this machine: never empty


# -- core assignment -------------------------------------------------------------------------
def _smt_two_sockets() -> list[CpuInfo]:
    """2 sockets x 2 cores x 2 threads; linux numbering: siblings are cpu and cpu+4."""
    out = []
    for cpu in range(8):
        core = cpu % 4
        out.append(CpuInfo(cpu=cpu, core=core % 2, socket=core // 2))
    return out


def _check_disjoint(sets: list[list[int]], threads: list[int]) -> None:
    assert [len(s) for s in sets] == threads
    flat = [c for s in sets for c in s]
    assert len(flat) == len(set(flat))


def test_assign_simple_and_not_from_zero() -> None:
    sets = assign_cores([1, 1], cpus=[6, 7], topology=[CpuInfo(6, 6, 0), CpuInfo(7, 7, 0)])
    assert sorted(map(tuple, sets)) == [(6,), (7,)]


def test_assign_physical_cores_before_siblings() -> None:
    topo = _smt_two_sockets()
    # socket 0 has cpus 0,1 (cores 0,1) and siblings 4,5
    sets = assign_cores([2], cpus=[0, 1, 4, 5], topology=topo)
    assert sets == [[0, 1]]
    sets = assign_cores([1, 1, 1], cpus=[0, 1, 4, 5], topology=topo)
    _check_disjoint(sets, [1, 1, 1])
    assert sets[0] == [0] and sets[1] == [1]  # both physical cores used before a sibling


def test_assign_never_spans_a_socket() -> None:
    topo = _smt_two_sockets()
    sets = assign_cores([4, 2, 2], cpus=range(8), topology=topo)
    _check_disjoint(sets, [4, 2, 2])
    socket = {i.cpu: i.socket for i in topo}
    for s in sets:
        assert len({socket[c] for c in s}) == 1


def test_assign_needs_exact_packing() -> None:
    # sockets of 3 and 3 cpus; [2, 2, 1, 1] fits only as 2+1 | 2+1
    topo = [CpuInfo(c, c, 0 if c < 3 else 1) for c in range(6)]
    sets = assign_cores([2, 2, 1, 1], cpus=range(6), topology=topo)
    _check_disjoint(sets, [2, 2, 1, 1])
    # and [3, 2] with one cpu left
    _check_disjoint(assign_cores([3, 2], cpus=range(6), topology=topo), [3, 2])


def test_assign_clear_error_when_too_many_threads() -> None:
    with pytest.raises(CoreAssignmentError, match=r"need 3 cpus .* only 2 are available \(4-5\)"):
        assign_cores([2, 1], cpus=[4, 5], topology=[CpuInfo(4, 0, 0), CpuInfo(5, 1, 0)])


def test_assign_clear_error_when_it_would_span_sockets() -> None:
    topo = _smt_two_sockets()
    with pytest.raises(CoreAssignmentError, match="spanning a socket"):
        assign_cores([6], cpus=range(8), topology=topo)


def test_assign_rejects_bad_thread_counts() -> None:
    with pytest.raises(CoreAssignmentError, match="integers >= 1"):
        assign_cores([0], cpus=[0])


def test_assign_empty_and_default_topology() -> None:
    assert assign_cores([], cpus=[0]) == []
    cpus = allowed_cpus()
    sets = assign_cores([1] * len(cpus), cpus=cpus)
    assert sorted(c for s in sets for c in s) == cpus


def test_assign_may_span_sockets_when_asked() -> None:
    topo = _smt_two_sockets()
    sets = assign_cores([6], cpus=range(8), topology=topo, span_sockets=True)
    assert len(sets[0]) == 6
    # socket 0's physical cores and siblings first, then socket 1's physical cores
    assert sets[0] == [0, 1, 2, 3, 4, 5]
    sets = assign_cores([2, 6], cpus=range(8), topology=topo, span_sockets=True)
    _check_disjoint(sets, [2, 6])
    # what fits within sockets is still placed within sockets
    sets = assign_cores([4, 4], cpus=range(8), topology=topo, span_sockets=True)
    socket = {i.cpu: i.socket for i in topo}
    assert all(len({socket[c] for c in s}) == 1 for s in sets)
