"""The device mesh a plan is made for: ``tp x ep x pp`` ranks.

``pp`` pipeline stages each run ``tp x ep`` ranks (a *stage group*; rank ``r`` is local rank
``r % (tp·ep)`` of stage ``r // (tp·ep)``). Inside a stage, attention and the other dense
layers are tensor-parallel over all ``tp·ep`` ranks; the experts of a mixture of experts
are split into ``ep`` groups of ``experts / ep`` (the first ``experts % ep`` groups take one
more), and each expert's weights are tensor-parallel over the ``tp`` ranks of its group —
TensorRT-LLM's ``moe_ep_size x moe_tp_size = tp_size``. All of a stage's collectives run on
its stage group: one all-reduce combines the partial sums of the experts.

Collectives name their process group by string, as torch's functional collectives do: a
mesh of one stage uses the default group ``"0"``; with stages, :func:`groups` lists the
groups ``torch.distributed.new_group`` creates on every rank, in order, and the names it
gives them (``"1"``, ``"2"``, ...) — :func:`fxpass.distributed.init_groups` creates them.

>>> mesh = Mesh.parse("tp=2,pp=2")
>>> mesh, mesh.world_size, str(mesh)
(Mesh(tp=2, ep=1, pp=2), 4, 'tp 2 x pp 2')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import FxpassError

__all__ = ["DIMS", "Mesh", "MeshError", "Place", "expert_range"]

#: The mesh's dims, in the order they appear in plans and on the command line.
DIMS = ("tp", "ep", "pp")


class MeshError(FxpassError):
    """A mesh is malformed (a one-line message names the dim and the value)."""


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MeshError(f"mesh {name} must be a positive integer, not {value!r}")
    return value


@dataclass(frozen=True)
class Mesh:
    """``tp`` tensor-parallel, ``ep`` expert-parallel, ``pp`` pipeline ranks (see above)."""

    tp: int = 1
    ep: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in DIMS:
            _positive(name, getattr(self, name))

    @property
    def world_size(self) -> int:
        return self.tp * self.ep * self.pp

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage (``tp · ep``): the dense layers' tensor-parallel degree."""
        return self.tp * self.ep

    def stage(self, rank: int) -> int:
        return rank // self.stage_size

    def local(self, rank: int) -> int:
        """The rank's index inside its stage group."""
        return rank % self.stage_size

    def expert_group(self, rank: int) -> int:
        return self.local(rank) // self.tp

    def tp_index(self, rank: int) -> int:
        """The rank's index among the ``tp`` ranks that share its experts."""
        return self.local(rank) % self.tp

    def stage_ranks(self, stage: int) -> list[int]:
        start = stage * self.stage_size
        return list(range(start, start + self.stage_size))

    def group_name(self, stage: int) -> str:
        """The process group the collectives of ``stage`` run on."""
        return "0" if self.pp == 1 else str(1 + stage)

    def pipe_ranks(self, local: int) -> list[int]:
        """The ranks, one per stage, that pass activations to each other."""
        return [s * self.stage_size + local for s in range(self.pp)]

    def pipe_group_name(self, local: int) -> str:
        return "0" if self.stage_size == 1 else str(1 + self.pp + local)

    def groups(self) -> list[tuple[str, list[int]]]:
        """``(name, ranks)`` of every process group beyond the default one, in the order
        they must be created (every rank creates all of them, as torch requires)."""
        if self.pp == 1:
            return []
        out = [(self.group_name(s), self.stage_ranks(s)) for s in range(self.pp)]
        if self.stage_size > 1:
            out += [(self.pipe_group_name(i), self.pipe_ranks(i)) for i in range(self.stage_size)]
        return out

    def place(self, rank: int, group: str | None = None) -> Place:
        if not 0 <= rank < self.world_size:
            raise MeshError(f"rank {rank} is not in the mesh {self}")
        return Place(self, rank, group)

    # ----- data ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DIMS}

    @classmethod
    def from_dict(cls, data: Any, where: str = "mesh") -> Mesh:
        if not isinstance(data, dict):
            raise MeshError(f"{where} must be an object like {{'tp': 2, 'ep': 1, 'pp': 1}}")
        unknown = sorted(set(data) - set(DIMS))
        if unknown:
            raise MeshError(f"{where} has no dim {unknown[0]!r}; its dims are tp, ep and pp")
        for name, value in data.items():
            _positive(f"{where}.{name}" if where != "mesh" else name, value)
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """``"tp=2,ep=2,pp=2"`` (dims left out are 1)."""
        data = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = item.partition("=")
            if not eq or not value.strip().isdigit():
                raise MeshError(f"mesh {text!r}: write dims as tp=2,ep=2,pp=2, not {item!r}")
            data[name.strip()] = int(value)
        return cls.from_dict(data)

    def __str__(self) -> str:
        return " x ".join(f"{n} {getattr(self, n)}" for n in DIMS if getattr(self, n) > 1) or "tp 1"


@dataclass(frozen=True)
class Place:
    """Where one rank sits in a mesh: its stage, its index in the stage group, its expert
    group and its index among that group's tensor-parallel ranks."""

    mesh: Mesh
    rank: int
    group_name: str | None = None  # another process group than the mesh's for the stage

    @property
    def stage(self) -> int:
        return self.mesh.stage(self.rank)

    @property
    def local(self) -> int:
        return self.mesh.local(self.rank)

    @property
    def size(self) -> int:
        return self.mesh.stage_size

    @property
    def group(self) -> str:
        return self.group_name or self.mesh.group_name(self.stage)

    @property
    def expert_group(self) -> int:
        return self.mesh.expert_group(self.rank)

    @property
    def tp_index(self) -> int:
        return self.mesh.tp_index(self.rank)

    def piece(self, ways: int) -> tuple[int, int]:
        """``(index, count)`` of this rank's piece of a value cut ``ways`` ways (0: over
        the whole stage group; else over the tensor-parallel ranks of its expert group)."""
        return (self.tp_index, ways) if ways else (self.local, self.size)


def expert_range(experts: int, groups: int, group: int) -> tuple[int, int]:
    """The experts ``[lo, hi)`` of ``group`` when ``experts`` are split into ``groups``
    (the first ``experts % groups`` groups take one more).

    >>> [expert_range(10, 4, g) for g in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(experts, groups)
    lo = group * base + min(group, extra)
    return lo, lo + base + (1 if group < extra else 0)
