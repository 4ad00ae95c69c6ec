"""How a profile point's instances are laid out on cores (packrat.profiler.layout): pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrat.plan.profile import ALONE, COLOCATED
from packrat.profiler.layout import point_layout
from packrat.runtime.cpus import CpuInfo


def _topology(sockets: int, per_socket: int, smt: int = 1) -> list[CpuInfo]:
    """cpus numbered socket by socket; SMT siblings share a core id."""
    out, cpu = [], 0
    for s in range(sockets):
        for c in range(per_socket // smt):
            for _ in range(smt):
                out.append(CpuInfo(cpu=cpu, core=s * 1000 + c, socket=s))
                cpu += 1
    return out


def test_two_cores_one_thread_is_two_timed_instances() -> None:
    layout = point_layout(1, [0, 1], topology=_topology(1, 2))
    assert layout.timed == ((0,), (1,)) and layout.filler == ()
    assert layout.instances == 2


def test_the_fat_point_is_one_instance_on_every_core() -> None:
    layout = point_layout(2, [4, 5], topology=_topology(1, 8))
    assert layout.timed == ((4, 5),) and layout.filler == ()


def test_remainder_cores_get_an_untimed_filler() -> None:
    layout = point_layout(5, list(range(16)), topology=_topology(1, 16))
    assert layout.instances == 3
    assert [len(c) for c in layout.timed] == [5, 5, 5]
    assert len(layout.filler) == 1
    assert layout.busy == tuple(range(16))


def test_remainder_left_idle_when_asked() -> None:
    layout = point_layout(5, list(range(16)), fill_remainder=False, topology=_topology(1, 16))
    assert layout.instances == 3 and layout.filler == ()
    assert len(layout.busy) == 15


def test_alone_is_one_instance_and_idle_neighbours() -> None:
    layout = point_layout(4, list(range(16)), mode=ALONE, topology=_topology(1, 16))
    assert layout.timed == ((0, 1, 2, 3),) and layout.filler == ()


def test_instances_stay_within_a_socket_when_they_fit() -> None:
    # 2 sockets x 8 cores, t=4: four instances, none spanning the sockets
    topo = _topology(2, 8)
    socket_of = {i.cpu: i.socket for i in topo}
    layout = point_layout(4, list(range(16)), topology=topo)
    assert layout.instances == 4
    for cores in layout.timed:
        assert len({socket_of[c] for c in cores}) == 1


def test_physical_cores_before_smt_siblings() -> None:
    # 8 cpus = 4 cores x 2 SMT: two 2-thread instances on distinct physical cores
    topo = _topology(1, 8, smt=2)
    core_of = {i.cpu: i.core for i in topo}
    layout = point_layout(2, list(range(8)), fill_remainder=False, topology=topo)
    assert layout.instances == 4
    assert len({core_of[c] for c in layout.timed[0]}) == 2  # no instance on its own siblings


@pytest.mark.parametrize(("threads", "mode"), [(0, COLOCATED), (3, COLOCATED), (1, "mixed")])
def test_bad_requests_are_refused(threads: int, mode: str) -> None:
    with pytest.raises(ValueError):
        point_layout(threads, [0, 1], mode=mode, topology=_topology(1, 2))


@given(
    sockets=st.integers(1, 2),
    per_socket=st.integers(1, 24),
    data=st.data(),
)
def test_co_located_layouts_are_disjoint_and_fill_the_cpuset(
    sockets: int, per_socket: int, data: st.DataObject
) -> None:
    topo = _topology(sockets, per_socket)
    cpus = [i.cpu for i in topo]
    total = len(cpus)
    threads = data.draw(st.integers(1, total))
    fill = data.draw(st.booleans())
    layout = point_layout(threads, cpus, fill_remainder=fill, topology=topo)
    assert layout.instances == total // threads  # floor(T/t), all timed
    assert all(len(c) == threads for c in layout.timed)
    sets = [*layout.timed, *([layout.filler] if layout.filler else [])]
    flat = [c for s in sets for c in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert set(flat) <= set(cpus)
    assert len(layout.filler) == (total % threads if fill else 0)
    assert len(layout.busy) == (total if fill else total - total % threads)
