"""Compile ranges: one compiled graph per range of a symbolic size, picked at run time.

vLLM compiles the one dynamic graph Dynamo captures once per range of token counts and, on
every call, runs the graph compiled for the range the call's token count falls in; a pass
that only pays off (or is only valid) for some sizes runs only in those compiles. The
backend does the same when it is given ranges::

    be = fxpass.backend(pipeline, ranges={"tokens": [(1, 512), (513, None)]},
                        dims={"tokens": ("ids", 1)})

``dims`` says which dimension of which argument of the compiled function each size is
(``("ids", 1)``: dimension 1 of the argument ``ids``); without it, a single size is the
first symbolic size among the graph's inputs (what vLLM assumes). For each compile the
backend

* finds the size in Dynamo's graph: a symbolic size gets one compile per configured range
  (and, when the ranges leave sizes out, one more without a range for them); a size Dynamo
  made static gets one compile, for exactly that size;
* compiles a copy of the graph per range, with that range as the compile range of every
  pipeline run (see :mod:`fxpass.core.ranges`): range-limited passes run only where they
  apply, and cache keys (fxpass's and Inductor's) include the range;
* returns a function that reads the size from its arguments and calls the graph compiled
  for it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..core.ranges import Ranges, SizeRange, format_ranges, to_ranges

__all__ = ["CompileRanges", "RangeDispatch", "RangePlan", "compile_ranges", "plan_ranges"]


@dataclass(frozen=True)
class CompileRanges:
    """The ranges to compile each symbolic size for, and where each size is."""

    sizes: Mapping[str, tuple[SizeRange, ...]]
    dims: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        return ", ".join(
            f"{name} in " + " | ".join(str(r) for r in rs) for name, rs in self.sizes.items()
        )


def compile_ranges(
    ranges: Mapping[str, Sequence[Any]], dims: Mapping[str, Any] | None = None
) -> CompileRanges:
    """Check and build a :class:`CompileRanges`: ``ranges`` maps each size to its ranges
    (``(low, high)`` pairs, ``high`` None for no bound; they must not overlap), ``dims``
    each size to ``(argument name, dimension)``."""
    if not isinstance(ranges, Mapping) or not ranges:
        raise ValueError(
            "ranges maps each symbolic size to the ranges to compile it for, e.g. "
            f"{{'tokens': [(1, 512), (513, None)]}}, not {ranges!r}"
        )
    sizes: dict[str, tuple[SizeRange, ...]] = {}
    for name, items in ranges.items():
        if isinstance(items, (str, tuple)) or not isinstance(items, Sequence) or not items:
            raise ValueError(
                f"ranges['{name}'] is a list of (low, high) ranges, e.g. [(1, 512), (513, None)], "
                f"not {items!r}"
            )
        parsed = sorted(to_ranges({name: item})[name] for item in items)
        for a, b in itertools.pairwise(parsed):
            if a.hi is None or a.hi >= b.lo:
                raise ValueError(f"the ranges of '{name}' overlap: {a} and {b}")
        sizes[name] = tuple(parsed)
    where: dict[str, tuple[str, int]] = {}
    for name, spot in (dims or {}).items():
        if name not in sizes:
            raise ValueError(f"dims names '{name}', which has no ranges; sizes: {sorted(sizes)}")
        if not (
            isinstance(spot, tuple)
            and len(spot) == 2
            and isinstance(spot[0], str)
            and isinstance(spot[1], int)
        ):
            raise ValueError(
                f"dims['{name}'] is (argument name, dimension), e.g. ('ids', 1), not {spot!r}"
            )
        where[name] = spot
    missing = [n for n in sizes if n not in where]
    if len(sizes) > 1 and missing:
        raise ValueError(
            f"with several sizes, say where each is: dims={{'{missing[0]}': ('argument', dim)}}"
        )
    return CompileRanges(sizes, where)


@dataclass(frozen=True)
class _Reader:
    """Where a size is among a compiled function's arguments: ``args[index]`` (an int) or
    ``args[index].shape[dim]``."""

    index: int
    dim: int | None

    def __call__(self, args: Sequence[Any]) -> int:
        value = args[self.index]
        return int(value if self.dim is None else value.shape[self.dim])


@dataclass
class RangePlan:
    """What to compile for one graph: ``combos`` (one compile range each), the ``readers``
    of the symbolic sizes, and ``fallback`` (the compile range for sizes outside every
    configured range; None when the ranges cover every size)."""

    combos: list[Ranges]
    readers: dict[str, _Reader]
    fallback: Ranges | None
    notes: list[str] = field(default_factory=list)


def _source_name(node: fx.Node) -> str | None:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return None
    name = source.name
    return name() if callable(name) else str(name)


def _find(
    name: str, spot: tuple[str, int] | None, placeholders: list[fx.Node], inputs: Sequence[Any]
) -> tuple[_Reader | None, int | None]:
    """(reader of a symbolic size, or None; its static value, or None)."""
    if spot is None:  # the first symbolic size among the inputs
        for i, (node, value) in enumerate(zip(placeholders, inputs)):
            if isinstance(value, torch.SymInt):
                return _Reader(i, None), None
            val = node.meta.get("example_value")
            if isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt):
                        return _Reader(i, d), None
        return None, None
    arg, dim = spot
    for i, node in enumerate(placeholders):
        if _source_name(node) == f"L['{arg}'].size()[{dim}]":
            return _Reader(i, None), None
    for i, node in enumerate(placeholders):
        if _source_name(node) == f"L['{arg}']":
            val = node.meta.get("example_value")
            if not isinstance(val, torch.Tensor) or dim >= val.dim():
                raise ValueError(f"dims['{name}']: argument '{arg}' has no dimension {dim}")
            size = val.shape[dim]
            return (_Reader(i, dim), None) if isinstance(size, torch.SymInt) else (None, int(size))
    return None, None


def plan_ranges(cr: CompileRanges, gm: fx.GraphModule, inputs: Sequence[Any]) -> RangePlan:
    """The compiles one Dynamo graph needs for ``cr`` (see the module docstring)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    readers: dict[str, _Reader] = {}
    choices: dict[str, tuple[SizeRange, ...]] = {}
    notes: list[str] = []
    uncovered = False
    for name, ranges in cr.sizes.items():
        reader, static = _find(name, cr.dims.get(name), placeholders, inputs)
        if reader is not None:
            readers[name] = reader
            choices[name] = ranges
            uncovered |= not _covers_all(ranges, _smallest(reader, placeholders, inputs))
        elif static is not None:
            choices[name] = (SizeRange(static, static),)
        else:
            notes.append(
                f"no symbolic size '{name}' in this graph (say where it is with dims=): "
                "compiled once, without a range"
            )
    combos = [dict(zip(choices, picked)) for picked in itertools.product(*choices.values())]
    fallback = None
    if uncovered:  # sizes outside the ranges: a graph without a range for the dynamic sizes
        fallback = {n: r[0] for n, r in choices.items() if n not in readers}
    return RangePlan(combos if choices else [{}], readers, fallback, notes)


def _smallest(reader: _Reader, placeholders: list[fx.Node], inputs: Sequence[Any]) -> int:
    """The smallest value the symbolic size can take: Dynamo compiles sizes 0 and 1 apart
    (a size it made symbolic is at least 2) unless the size is unbacked."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    value = inputs[reader.index]
    if reader.dim is not None:
        val = placeholders[reader.index].meta.get("example_value")
        value = val.shape[reader.dim] if isinstance(val, torch.Tensor) else value
    return 0 if isinstance(value, torch.SymInt) and free_unbacked_symbols(value) else 2


def _covers_all(ranges: Sequence[SizeRange], start: int = 0) -> bool:
    """Whether the sorted ``ranges`` leave no size from ``start`` up out."""
    end = start - 1
    for r in ranges:
        if r.lo > end + 1:
            return False
        if r.hi is None:
            return True
        end = r.hi
    return False


class RangeDispatch:
    """Calls the function compiled for the range each size of the call falls in."""

    def __init__(
        self,
        readers: Mapping[str, _Reader],
        entries: Sequence[tuple[Ranges, Callable[..., Any]]],
        fallback: Callable[..., Any] | None = None,
    ) -> None:
        self.readers = dict(readers)
        self.entries = list(entries)
        self.fallback = fallback
        self.calls: dict[str, int] = {}  # how often each compiled range ran

    def __call__(self, *args: Any) -> Any:
        sizes = {name: read(args) for name, read in self.readers.items()}
        for ranges, fn in self.entries:
            if all(size in ranges[name] for name, size in sizes.items()):
                label = format_ranges(ranges) if ranges else "-"
                self.calls[label] = self.calls.get(label, 0) + 1
                return fn(*args)
        if self.fallback is None:  # pragma: no cover - plan_ranges adds one when needed
            raise RuntimeError(f"fxpass: no graph was compiled for the sizes {sizes}")
        self.calls["outside"] = self.calls.get("outside", 0) + 1
        return self.fallback(*args)

    def __repr__(self) -> str:
        ranges = [format_ranges(r) if r else "-" for r, _ in self.entries]
        return f"RangeDispatch({ranges}{', fallback' if self.fallback else ''})"
