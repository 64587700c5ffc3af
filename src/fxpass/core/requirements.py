"""Requirements between passes: "needs X before me" and "X must follow me".

Ordering constraints (:meth:`~fxpass.Pipeline.this_before_that`) only order passes that are
both in a pipeline; they cannot say that a pass must run at all (ExecuTorch added mandatory
"must run after" requirements for this). A pass declares

* ``needs = ("remove_assert_ops",)`` — these passes must have run before it in the same
  pipeline (a fusion that only matches once export's assert nodes are gone);
* ``followed_by = ("dce",)`` — these passes must run after it (a pass that leaves dead
  nodes behind).

as class attributes, attributes of a function pass, or ``fp.register(..., needs=...,
followed_by=...)``. A pipeline that breaks a requirement is refused before it runs — from
a spec, with the column of the pass that declared it — unless the required passes are
inserted where the pipeline is read: ``Pipeline.parse(spec, insert_required=True)`` or
:func:`with_required` put each missing pass right before the pass that needs it (or right
after the pass it must follow).

"Before" is the order the passes run in: a pass inside a nested pipeline or fixpoint
that comes earlier counts; a pass is never its own requirement.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .contract import Pass
from .errors import SpecError
from .pass_registry import as_pass
from .run import PassGroup

__all__ = [
    "RequirementError",
    "check_requirements",
    "declared_followers",
    "declared_needs",
    "with_required",
]


class RequirementError(SpecError):
    """A pass needs another pass before (or after) it that the pipeline does not run there.

    ``pass_name`` declared the requirement, ``required`` is the missing pass and ``kind`` is
    ``"needs"`` or ``"followed_by"``; ``column`` points at the declaring pass in ``spec``.
    """

    def __init__(
        self, pass_name: str, required: str, kind: str, where: str, spec: str, column: int
    ) -> None:
        self.pass_name, self.required, self.kind = pass_name, required, kind
        if kind == "needs":
            want = f"pass '{pass_name}' needs '{required}' to run before it"
            fix = f"write '{required},{pass_name}'"
        else:
            want = f"pass '{pass_name}' must be followed by '{required}'"
            fix = f"write '{pass_name},{required}'"
        message = (
            f"{want}, but {where}; {fix}, or read the pipeline with insert_required=True "
            "to insert it there"
        )
        super().__init__(message, spec or pass_name, max(column, 1))


def _declared(p: Any, attr: str) -> tuple[str, ...]:
    for obj in (p, getattr(p, "fn", None), getattr(p, "obj", None)):
        value = getattr(obj, attr, None) if obj is not None else None
        if value:
            names = (value,) if isinstance(value, str) else tuple(value)
            if not all(isinstance(n, str) and n for n in names):
                raise TypeError(
                    f"{attr} of pass '{getattr(p, 'name', p)}' names passes by their "
                    f"registered names (strings), not {value!r}"
                )
            return names
    return ()


def declared_needs(p: Any) -> tuple[str, ...]:
    """The passes ``p`` needs to have run before it."""
    return _declared(p, "needs")


def declared_followers(p: Any) -> tuple[str, ...]:
    """The passes that must run after ``p``."""
    return _declared(p, "followed_by")


@dataclass
class _Entry:
    p: Pass
    parent: PassGroup | None
    start: int  # position in the run order
    end: int  # the position after its last nested pass


def _flatten(pipeline: PassGroup) -> list[_Entry]:
    out: list[_Entry] = []

    def walk(pipe: PassGroup) -> None:
        for p in pipe.passes:
            entry = _Entry(p, pipe, len(out), 0)
            out.append(entry)
            if isinstance(p, PassGroup):
                walk(p)
            entry.end = len(out)

    walk(pipeline)
    return out


@dataclass
class _Violation:
    entry: _Entry
    required: str
    kind: str
    where: str


def _violations(pipeline: PassGroup) -> Iterator[_Violation]:
    entries = _flatten(pipeline)
    for e in entries:
        for name in declared_needs(e.p):
            positions = [o.start for o in entries if o.p.name == name and o is not e]
            if not any(pos < e.start for pos in positions):
                where = (
                    "the pipeline runs it only after it"
                    if positions
                    else "the pipeline does not run it"
                )
                yield _Violation(e, name, "needs", where)
        for name in declared_followers(e.p):
            positions = [o.start for o in entries if o.p.name == name and o is not e]
            if not any(pos >= e.end for pos in positions):
                where = (
                    "the pipeline runs it only before it"
                    if positions
                    else "the pipeline does not run it"
                )
                yield _Violation(e, name, "followed_by", where)


def check_requirements(
    pipeline: PassGroup, *, spec: str | None = None, columns: Mapping[int, int] | None = None
) -> None:
    """Raise :class:`RequirementError` for the first requirement ``pipeline`` breaks.

    ``spec`` and ``columns`` (``id(pass)`` -> 1-based column) say where each pass was
    written; by default the columns are found in the pipeline's printed spec."""
    for v in _violations(pipeline):
        text = spec if spec is not None else str(pipeline)
        where = (columns if columns is not None else _printed_columns(pipeline)).get(id(v.entry.p))
        raise RequirementError(v.entry.p.name, v.required, v.kind, v.where, text, where or 1)


def _printed_columns(pipeline: PassGroup) -> dict[int, int]:
    """Where each pass starts in ``str(pipeline)`` (nested passes inside a pipeline that is
    written as a reference point at that reference)."""
    out: dict[int, int] = {}

    def walk(pipe: PassGroup, offset: int, own: int | None) -> None:
        written = pipe.written_as is not None
        for p in pipe.passes:
            out[id(p)] = own if written and own is not None else offset + 1
            if isinstance(p, PassGroup):
                inner = offset + len(p.head) + 1 if p.written_as is None else offset
                walk(p, inner, out[id(p)] if p.written_as is not None else None)
            if not written:
                offset += len(p.spec) + 1

    top = pipeline.written_as is not None
    walk(pipeline, 0, 1 if top else None)
    return out


def with_required(pipeline: PassGroup, *, limit: int = 64) -> PassGroup:
    """A copy of ``pipeline`` with every missing required pass inserted: right before the
    pass that needs it, right after the pass it must follow."""
    result = _copy_tree(pipeline)
    seen: set[tuple[int, str, str]] = set()
    for _ in range(limit):
        v = next(_violations(result), None)
        if v is None:
            return result
        key = (id(v.entry.p), v.required, v.kind)
        if key in seen or v.entry.parent is None:  # inserted, and the order still breaks it
            check_requirements(result)
        seen.add(key)
        parent = v.entry.parent
        passes = list(parent._passes)
        at = next(i for i, q in enumerate(passes) if q is v.entry.p)
        passes.insert(at if v.kind == "needs" else at + 1, as_pass(v.required))
        parent.set_passes(passes)
        parent.written_as = None  # print the passes as they now are
    check_requirements(result)
    return result


def _copy_tree(pipeline: PassGroup) -> PassGroup:
    new = copy.copy(pipeline)
    new.set_passes(_copy_tree(p) if isinstance(p, PassGroup) else p for p in pipeline._passes)
    return new
