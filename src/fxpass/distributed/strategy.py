"""The strategies: one table, each entry a parallelism with its part of every step.

A :class:`Strategy` is one module's ``STRATEGY``, an instance of that module's subclass:
its plan section (:class:`Section`, read and written by :class:`~.plan.ShardPlan` from this
table) and its methods ``analyze`` (what it finds in the program when a plan is made),
``split`` (only pipeline stages: the program cut into one program per stage), ``prepare``
(the plan followed once for one stage's program: the script, by node name, its ranks apply;
None: nothing to do there) and ``rewrite`` (the pass one rank runs, given the script and the
rank's :class:`~.mesh.Place`).

:func:`strategies` finds every module of :mod:`fxpass.distributed` that defines ``STRATEGY``
and orders them by ``order`` (the order their rewrites run on each rank), so adding a
strategy is adding its module (docs/architecture.md, "Adding a distributed strategy").

The plan's options (``sequence_parallel``, ``fuse``, ``bucket``, ``async_tp``) are not
strategies: they choose no layout and have no section of decisions, only a value and a size
gate, and refine whatever collectives the strategies inserted; they run after them
(:mod:`.shard_options`).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..core.contract import Pass
from .mesh import Mesh, Place
from .sites import Params

__all__ = [
    "Section",
    "Strategy",
    "StrategyPass",
    "Survey",
    "analyze_into",
    "handed_context",
    "split_program",
    "strategies",
    "strategy",
]


@dataclass(frozen=True)
class Section:
    """A strategy's part of the plan: the list ``name`` of ``entry`` objects (each a
    dataclass with ``to_dict()`` and ``from_dict(data, where)``). ``required``: a plan file
    must have it; ``check(entries, mesh)`` raises :class:`~.plan.PlanError` when the entries
    do not fit the mesh. An entry with a ``line(i)`` method prints as that line under the
    plan's table of decisions."""

    name: str
    entry: type
    required: bool = False
    check: Callable[[list, Mesh], None] | None = None


@dataclass
class Survey:
    """One program as the strategies see it, while a plan is made or followed: its graph
    module and weights, the mesh (None until it is resolved), how to treat layers the ranks
    do not divide, and whether it is one pipeline stage of a larger program. ``facts`` keeps
    what is found once and read by several steps (the expert blocks: the mesh's choice and
    both parallelisms read them)."""

    program: Any
    gm: fx.GraphModule
    params: Params
    mesh: Mesh | None = None
    uneven: str = "error"
    staged: bool = False

    def __post_init__(self) -> None:
        if self.uneven not in ("error", "replicate"):
            raise ValueError(f"uneven must be 'error' or 'replicate', not {self.uneven!r}")
        self.facts: dict[str, Any] = {}

    @classmethod
    def of(cls, program: Any, mesh: Mesh | None = None, *, uneven: str = "error",
           staged: bool = False) -> Survey:  # fmt: skip
        if isinstance(program, torch.export.ExportedProgram):
            gm, params = program.graph_module, Params(program.graph_module,
                                                       program.graph_signature)  # fmt: skip
        elif isinstance(program, fx.GraphModule):
            gm, params = program, Params(program)
        else:
            raise TypeError(
                "sharding takes a torch.export.ExportedProgram (or a .pt2 file loaded with "
                f"torch.export.load) or a torch.fx.GraphModule, got {type(program).__name__}"
            )
        return cls(program, gm, params, mesh, uneven, staged)

    def fact(self, key: str, find: Callable[[Survey], Any]) -> Any:
        """``find(self)``, computed once per survey."""
        if key not in self.facts:
            self.facts[key] = find(self)
        return self.facts[key]


class Strategy:
    """One parallelism (see the module docstring): subclass it, set ``name`` and ``order``
    (and ``section`` where it has decisions of its own), and override the steps it takes
    part in; its module's ``STRATEGY`` is an instance. Every step it does not override does
    nothing: a strategy without ``analyze`` only follows sections a user wrote, one without
    ``rewrite`` only plans."""

    name: str = ""
    order: int = 0
    section: Section | None = None

    def analyze(self, survey: Survey, plan: Any) -> list | None:
        """The entries of its section found in the program (``plan``: the plan made so far,
        the sections of the strategies before it in ``order``); None: it finds none
        itself."""
        return None

    def split(self, program: Any, plan: Any) -> Any:
        """The program cut into one program per stage (a ``PipelineStages``), or None."""
        return None

    def prepare(self, survey: Survey, plan: Any, scripts: Mapping[str, Any]) -> Any:
        """The plan followed once for one stage's program: the script, by node name, its
        ranks apply, or None (nothing to do there). ``scripts[name]`` is another strategy's
        script for the same stage (prepared on first use)."""
        return None

    def rewrite(self, script: Any, place: Place) -> Pass:
        """What the rank at ``place`` runs, given the script :meth:`prepare` made."""
        raise NotImplementedError(f"strategy {self.name} prepared a script but has no rewrite")

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"


def _discover() -> list[Strategy]:
    package = importlib.import_module(__package__)
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        entry = getattr(module, "STRATEGY", None)
        if isinstance(entry, Strategy):
            found.append(entry)
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two distributed modules define the strategy of one name: {names}")
    return sorted(found, key=lambda s: (s.order, s.name))


@functools.cache
def _table() -> tuple[Strategy, ...]:
    return tuple(_discover())


def strategies() -> tuple[Strategy, ...]:
    """Every strategy of :mod:`fxpass.distributed`, in the order their rewrites run."""
    return _table()


def strategy(name: str) -> Strategy:
    """The strategy called ``name``."""
    for s in strategies():
        if s.name == name:
            return s
    raise KeyError(f"no strategy {name!r}; strategies: {', '.join(s.name for s in strategies())}")


def analyze_into(survey: Survey, plan: Any) -> None:
    """Each strategy's analysis fills its section of ``plan``, in order."""
    for s in strategies():
        entries = s.analyze(survey, plan) if s.section is not None else None
        if entries is not None:
            plan.sections[s.section.name] = list(entries)


def split_program(survey: Survey, plan: Any) -> Any:
    """The program cut by the strategy that splits it (pipeline stages: the stage programs,
    the plan's stages written), or None."""
    cut = None
    for s in strategies():
        made = s.split(survey.program, plan)
        if made is not None and cut is not None:
            raise RuntimeError(f"two strategies split the program ({s.name} is the second)")
        cut = made if made is not None else cut
    return cut


class StrategyPass(Pass):
    """A strategy's rewrite for one rank, as a pass of the rank's pipeline. It defines
    ``execute(gm, ctx)``, the method a run calls on each of its passes, so it is handed the
    run's :class:`~fxpass.core.PassContext`: it edits through ``ctx.editor`` and reaches the
    program it runs on (weights, signature) through ``ctx.program``."""

    edits = "any"  # weights are replaced in the program's state, outside the graph

    def call(self, gm: fx.GraphModule) -> Any:
        raise RuntimeError(f"{self.name} runs inside a rank's pipeline (fxpass.shard)")

    def execute(self, gm: fx.GraphModule, ctx: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement execute(gm, ctx)")


def handed_context(ctx: Any, pass_name: str) -> Any:
    """The :class:`~fxpass.core.PassContext` a registered function pass was handed (its
    ``ctx`` parameter), or a one-line error when ``pass_name`` was called as a plain
    function. The strategies' rewrites in ``fxpass.shard`` are :class:`StrategyPass`
    objects, handed it by the run as every pass (``execute(gm, ctx)``)."""
    if ctx is None:
        raise RuntimeError(
            f"{pass_name} is a pass: run it in a pipeline (fxpass.apply(program, "
            f"'{pass_name}'), or as a pass of torch.compile's backend)"
        )
    return ctx
