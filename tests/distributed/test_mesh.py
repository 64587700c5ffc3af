"""A mesh: tp x ep x pp ranks, where each rank sits, the groups its collectives run on."""

from __future__ import annotations

import pytest

from fxpass.distributed.mesh import Mesh, MeshError, expert_range


def test_ranks_stages_and_groups():
    mesh = Mesh(tp=2, ep=2, pp=2)
    assert (mesh.world_size, mesh.stage_size, str(mesh)) == (8, 4, "tp 2 x ep 2 x pp 2")
    place = mesh.place(6)
    assert (place.stage, place.local, place.expert_group, place.tp_index) == (1, 2, 1, 0)
    assert place.group == "2" and place.piece(0) == (2, 4) and place.piece(2) == (0, 2)
    assert mesh.groups() == [
        ("1", [0, 1, 2, 3]),
        ("2", [4, 5, 6, 7]),
        *((str(3 + i), [i, 4 + i]) for i in range(4)),
    ]
    assert Mesh(tp=4).groups() == [] and Mesh(tp=4).place(3).group == "0"
    assert Mesh(pp=2).groups() == [("1", [0]), ("2", [1])]


def test_parse_and_data():
    assert Mesh.parse("tp=2, pp=2") == Mesh(tp=2, pp=2)
    assert Mesh.from_dict(Mesh(ep=4).to_dict()) == Mesh(ep=4)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Mesh(tp=0), "mesh tp must be a positive integer, not 0"),
        (lambda: Mesh.parse("tp=2,ep"), "write dims as tp=2,ep=2,pp=2, not 'ep'"),
        (lambda: Mesh.from_dict({"dp": 2}), "has no dim 'dp'"),
        (lambda: Mesh(tp=2).place(2), "rank 2 is not in the mesh tp 2"),
    ],
)
def test_bad_meshes(make, message):
    with pytest.raises(MeshError, match=message):
        make()


def test_experts_split_with_a_remainder():
    assert [expert_range(6, 4, g) for g in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert expert_range(4, 2, 1) == (2, 4)
