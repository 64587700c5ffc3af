"""The sharding plan: one piece of data over a mesh, that a user can print, edit and pass back.

A plan holds a section per strategy, all over one :class:`~fxpass.distributed.mesh.Mesh`:

* ``decisions`` (tensor parallelism): one :class:`Decision` per weight the analysis looked at
  — how it is cut (``column``: its output features; ``row``: its input features; ``vocab``:
  an embedding's rows; ``batch``: a stack of experts cut by expert, each rank running its
  experts on all tokens; ``slice``: cut with the activation it meets, like a q/k norm's
  per-feature scale or attention sinks; ``replicate``: whole on every rank, with the bytes
  that costs each rank), which graph node reads it, the parts a fused projection is cut
  in, and why;
* ``experts`` (expert parallelism): one :class:`ExpertBlock` per mixture of experts — its
  router, its expert weights and where their rows are combined;
* ``stages`` (pipeline parallelism): one :class:`Stage` per pipeline stage — its nodes and
  the activations it receives and sends;
* ``options``: the passes run on the sharded graphs (``sequence_parallel``, ``fuse``,
  ``bucket``, ``async_tp``), ``gates`` (the token counts each applies to) and ``applied``
  (what each did, and why: :mod:`.shard_options`);
* ``collectives``: what the plan implies per forward (derived again when it is used).

A plan round-trips through JSON (``plan.save(path)`` / ``ShardPlan.load(path)``) and prints
as a table. Reading one checks every field and says which is wrong in one line
(:class:`PlanError`); a plan for another mesh or program is refused before any rank is made.
A section belongs to a strategy (its ``STRATEGY.section``, :mod:`.strategy`): the plan
reads and writes every section the table of strategies names, so adding a strategy with a
section of its own edits nothing here (see ``docs/architecture.md``). Files of the old format
``fxpass.shard_plan/1`` (a world size instead of a mesh) are still read.

.. code-block:: json

    {"format": "fxpass.shard_plan/2", "mesh": {"tp": 2, "ep": 1, "pp": 1},
     "decisions": [{"param": "model.layers.0.self_attn.q_proj.weight", "style": "column",
                    "dim": 0, "node": "linear", "parts": [], "bias": null, "ways": 0,
                    "bytes": 0, "reason": "column-parallel: reads replicated 'mul_4'; ..."}],
     "experts": [], "stages": [], "options": {"sequence_parallel": false, "fuse": false}}
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from ..core.errors import FxpassError
from .mesh import DIMS, Mesh

__all__ = [
    "DEFAULT_BUCKET",
    "FORMAT",
    "OPTIONS",
    "STYLES",
    "Decision",
    "Entry",
    "ExpertBlock",
    "PlanError",
    "ShardError",
    "ShardPlan",
    "Stage",
    "check_stages",
    "plural",
]

FORMAT = "fxpass.shard_plan/2"
_OLD_FORMAT = "fxpass.shard_plan/1"  # world_size instead of a mesh
#: Each style, and the dim of a 2-D weight it cuts (None: any the site says, or none).
STYLES: dict[str, int | None] = {"column": 0, "row": 1, "vocab": 0, "batch": 0, "slice": None,
                                 "replicate": None}  # fmt: skip
#: The passes a plan can ask for on the sharded graphs, and their defaults (off): flags,
#: and for ``bucket`` the threshold in bytes, for ``async_tp`` the chunks per matmul
#: (:mod:`.shard_options`).
OPTIONS: dict[str, Any] = {"sequence_parallel": False, "fuse": False, "bucket": 0,
                           "async_tp": 0}  # fmt: skip
#: ``bucket=True``: merge collectives of at most this many bytes each
DEFAULT_BUCKET = 64 * 1024


class ShardError(FxpassError):
    """A program cannot be sharded as asked (a one-line message says why and what to do)."""


class PlanError(ShardError):
    """A plan is malformed or does not fit the program it is applied to."""


def plural(n: int, word: str) -> str:
    """``"1 rank"``, ``"2 ranks"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ----- reading fields, one line per mistake ------------------------------------------------
_MISSING: Any = object()
_KINDS = {int: "an integer", str: "a string", bool: "true or false", list: "a list",
          dict: "an object"}  # fmt: skip


def _get(data: dict, where: str, name: str, kind: Any, default: Any = _MISSING) -> Any:
    if name not in data:
        if default is _MISSING:
            raise PlanError(f"plan field '{where}.{name}' is missing")
        return default
    value = data[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(
        value is None if k is None else isinstance(value, k) and not (k is int and value is True)
        for k in kinds
    )
    if not ok or (int in kinds and isinstance(value, bool)):
        want = " or ".join("null" if k is None else _KINDS[k] for k in kinds)
        raise PlanError(f"plan field '{where}.{name}' must be {want}, not {value!r}")
    return value


def _strings(data: dict, where: str, name: str) -> list[str]:
    items = _get(data, where, name, list, [])
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise PlanError(f"plan field '{where}.{name}[{i}]' must be a string, not {item!r}")
    return list(items)


def _ints(data: dict, where: str, name: str) -> list[int]:
    items = _get(data, where, name, list, [])
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise PlanError(
                f"plan field '{where}.{name}[{i}]' must be a positive integer, not {item!r}"
            )
    return list(items)


def _unknown(data: dict, where: str, known: Any) -> None:
    extra = sorted(set(data) - set(known))
    if extra:
        raise PlanError(f"plan field '{where}' has an unknown key {extra[0]!r}")


def _gates(data: dict) -> dict[str, list[int | None]]:
    """``{option: [lo, hi]}``: token counts, ``hi`` null for no bound."""
    _unknown(data, "gates", OPTIONS)
    out: dict[str, list[int | None]] = {}
    for name, value in data.items():
        ok = (
            isinstance(value, list)
            and len(value) == 2
            and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value)
            and isinstance(value[0], int)
            and value[0] >= 0
            and (value[1] is None or value[1] >= value[0])
        )
        if not ok:
            raise PlanError(
                f"plan field 'gates.{name}' must be [lo, hi] token counts (hi >= lo, or null "
                f"for no bound), not {value!r}"
            )
        out[name] = list(value)
    return out


def _gate(name: str, value: Any) -> list[int | None]:
    """A gate given in Python: ``(lo, hi)`` or ``"lo..hi"`` token counts, checked."""
    from ..core.ranges import parse_ranges, to_ranges

    if name not in OPTIONS:
        raise ShardError(f"no option {name!r} to gate; options: {', '.join(OPTIONS)}")
    try:
        if isinstance(value, str):  # "lo..hi", as in applies_to=tokens:lo..hi
            rng = parse_ranges(f"tokens:{value}")["tokens"]
        else:
            rng = to_ranges({"tokens": value})["tokens"]
    except ValueError as e:
        raise ShardError(f"gate for {name}: {e}") from None
    return [rng.lo, rng.hi]


# ----- the sections ------------------------------------------------------------------------
class Entry:
    """An entry of a plan section (a dataclass): JSON out (``to_dict``), and JSON in
    (``from_dict(data, where)``), checked — here only its keys (an unknown one, a missing
    one); an entry whose fields need more checks overrides ``from_dict``, reading each
    field with the checks of this module, as :class:`Decision` does."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def _fields(cls, data: Any, where: str) -> dict:
        if not isinstance(data, dict):
            raise PlanError(f"plan field '{where}' must be an object, not {data!r}")
        _unknown(data, where, (f.name for f in dataclasses.fields(cls)))  # type: ignore[arg-type]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Any:
        data = cls._fields(data, where)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if missing and f.name not in data:
                raise PlanError(f"plan field '{where}.{f.name}' is missing")
        return cls(**data)


@dataclass
class Decision(Entry):
    """How one weight is laid out across the ranks of a stage, and why."""

    param: str
    style: str
    node: str
    dim: int | None = None
    parts: list[int] = field(default_factory=list)
    bias: str | None = None
    reason: str = ""
    ways: int = 0  # cut into this many pieces (0: every rank of the stage)
    bytes: int = 0  # for replicated weights: what each rank keeps that it could share

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise PlanError(
                f"decision for '{self.param}': style must be one of "
                f"{', '.join(sorted(STYLES))}, not {self.style!r}"
            )
        if self.dim is None:
            self.dim = STYLES[self.style]
        if self.style == "replicate" and self.dim is not None:
            raise PlanError(f"decision for '{self.param}': a replicated weight has no dim")
        if self.style in ("column", "row", "slice") and self.dim is None:
            raise PlanError(f"decision for '{self.param}': a {self.style} weight needs a dim")
        if self.style in ("vocab", "batch") and self.dim != 0:
            raise PlanError(
                f"decision for '{self.param}': a {self.style} weight is cut along dim 0"
            )
        if self.dim is not None and self.dim < 0:
            raise PlanError(f"decision for '{self.param}': dim must be >= 0, not {self.dim}")
        self.parts = [int(p) for p in self.parts or ()]

    @property
    def sharded(self) -> bool:
        return self.style != "replicate"

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Decision:
        data = cls._fields(data, where)
        dim = _get(data, where, "dim", (int, None), None)
        if dim is not None and dim < 0:
            raise PlanError(f"plan field '{where}.dim' must be >= 0, not {dim}")
        return cls(
            param=_get(data, where, "param", str),
            style=_get(data, where, "style", str),
            node=_get(data, where, "node", str),
            dim=dim,
            parts=_ints(data, where, "parts"),
            bias=_get(data, where, "bias", (str, None), None),
            reason=_get(data, where, "reason", str, ""),
            ways=_get(data, where, "ways", int, 0),
            bytes=_get(data, where, "bytes", int, 0),
        )


@dataclass
class ExpertBlock(Entry):
    """A mixture of experts split across expert groups: ``router`` is the top-k node,
    ``weights`` the expert stacks (dim 0: the experts), ``exits`` where each rank's rows
    leave the experts (masked to the rows of its experts, then partial sums)."""

    router: str
    experts: int
    weights: list[str]
    exits: list[str]
    reason: str = ""

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ExpertBlock:
        data = cls._fields(data, where)
        experts = _get(data, where, "experts", int)
        if experts < 2:
            raise PlanError(f"plan field '{where}.experts' must be at least 2, not {experts}")
        return cls(
            router=_get(data, where, "router", str),
            experts=experts,
            weights=_strings(data, where, "weights"),
            exits=_strings(data, where, "exits"),
            reason=_get(data, where, "reason", str, ""),
        )

    def line(self, i: int) -> str:
        return f"experts at '{self.router}': {self.reason}"


@dataclass
class Stage(Entry):
    """One pipeline stage: the graph's nodes ``first`` to ``last`` (in order), the values
    it ``receives`` and ``sends``, and its share of the weights and FLOPs."""

    first: str
    last: str
    receives: list[str] = field(default_factory=list)
    sends: list[str] = field(default_factory=list)
    weight_bytes: int = 0
    flops: int = 0

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Stage:
        data = cls._fields(data, where)
        return cls(
            first=_get(data, where, "first", str),
            last=_get(data, where, "last", str),
            receives=_strings(data, where, "receives"),
            sends=_strings(data, where, "sends"),
            weight_bytes=_get(data, where, "weight_bytes", int, 0),
            flops=_get(data, where, "flops", int, 0),
        )

    def line(self, i: int) -> str:
        return (
            f"stage {i}: '{self.first}' .. '{self.last}', {self.weight_bytes:,} bytes of "
            f"weights, {self.flops:,} FLOPs; sends {', '.join(map(repr, self.sends)) or 'the outputs'}"
        )


def _sections() -> list[Any]:
    """The plan's sections, from the table of strategies (:mod:`.strategy`)."""
    from .strategy import strategies

    return [s.section for s in strategies() if s.section is not None]


def check_stages(stages: list[Stage], mesh: Mesh) -> None:
    """A plan's stages, if it lists any, are one per pipeline stage of its mesh."""
    if stages and len(stages) != mesh.pp:
        raise PlanError(f"the plan has {plural(len(stages), 'stage')} but its mesh pp is {mesh.pp}")


@dataclass(init=False)
class ShardPlan:
    """Every decision for one program over one mesh (see the module docstring): a list per
    strategy's section (``plan.sections[name]``; ``decisions``, ``experts`` and ``stages``
    name the built-in ones), the options, their gates and what they did."""

    mesh: Mesh
    sections: dict[str, list[Any]]
    collectives: list[dict[str, Any]]
    options: dict[str, Any]
    #: option -> [lo, hi] token counts it applies to (hi None: no bound); see .shard_options
    gates: dict[str, list[int | None]]
    #: what the options did, filled in by shard: option, pass, value, applied, why
    applied: list[dict[str, Any]]

    def __init__(
        self,
        mesh: Mesh | int,
        decisions: list[Decision] | None = None,
        collectives: list[dict[str, Any]] | None = None,
        experts: list[ExpertBlock] | None = None,
        stages: list[Stage] | None = None,
        options: dict[str, Any] | None = None,
        gates: dict[str, list[int | None]] | None = None,
        applied: list[dict[str, Any]] | None = None,
        *,
        sections: dict[str, list[Any]] | None = None,
    ) -> None:
        # ShardPlan(2, decisions): tensor parallelism on 2
        self.mesh = Mesh(tp=mesh) if isinstance(mesh, int) else mesh
        self.sections = {s.name: [] for s in _sections()}
        self.sections.update({k: list(v) for k, v in (sections or {}).items()})
        for name, given in (("decisions", decisions), ("experts", experts), ("stages", stages)):
            if given is not None:
                self.sections[name] = list(given)
        self.collectives = list(collectives or [])
        self.options = {**OPTIONS, **(options or {})}
        self.gates = dict(gates or {})
        self.applied = list(applied or [])

    def _section(name: str) -> Any:
        def get(self: ShardPlan) -> list[Any]:
            return self.sections.setdefault(name, [])

        def put(self: ShardPlan, value: list[Any]) -> None:
            self.sections[name] = list(value)

        return property(get, put, doc=f"The ``{name}`` section.")

    decisions = _section("decisions")
    experts = _section("experts")
    stages = _section("stages")
    del _section

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.decisions)

    def __len__(self) -> int:
        return len(self.decisions)

    def __getitem__(self, param: str) -> Decision:
        for d in self.decisions:
            if d.param == param:
                return d
        raise KeyError(f"the plan has no decision for '{param}'")

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def sharded(self) -> list[Decision]:
        return [d for d in self.decisions if d.sharded]

    def set_options(
        self,
        sequence_parallel: bool | None = None,
        fuse: bool | None = None,
        bucket: int | bool | None = None,
        async_tp: int | None = None,
        gates: dict[str, Any] | None = None,
    ) -> None:
        """The options given override the plan's (None: keep the plan's); ``gates``:
        ``{option: (lo, hi)}`` or ``"lo..hi"`` token counts, added to the plan's."""
        for key, value in (("sequence_parallel", sequence_parallel), ("fuse", fuse)):
            if value is not None:
                self.options[key] = bool(value)
        if bucket is not None:
            self.options["bucket"] = DEFAULT_BUCKET if bucket is True else int(bucket)
        if async_tp is not None:
            self.options["async_tp"] = int(async_tp)
        for key in ("bucket", "async_tp"):
            if self.options[key] < 0:
                raise ShardError(f"{key} must be >= 0, not {self.options[key]}")
        for name, value in (gates or {}).items():
            self.gates[name] = _gate(name, value)

    def collective_counts(self) -> dict[str, int]:
        """How many of each kind of collective a forward issues on each rank."""
        counts: dict[str, int] = {}
        for c in self.collectives:
            counts[c["op"]] = counts.get(c["op"], 0) + 1
        return counts

    # ----- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "mesh": self.mesh.to_dict(),
            "world_size": self.world_size,
            "options": dict(self.options),
        }
        for section in _sections():
            out[section.name] = [e.to_dict() for e in self.sections.get(section.name, [])]
        out["collectives"] = list(self.collectives)
        out["gates"] = {k: list(v) for k, v in self.gates.items()}
        out["applied"] = [dict(a) for a in self.applied]
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    @classmethod
    def from_dict(cls, data: Any) -> ShardPlan:
        if not isinstance(data, dict) or data.get("format") not in (FORMAT, _OLD_FORMAT):
            raise PlanError(f"not a sharding plan: expected a JSON object with format {FORMAT!r}")
        sections = _sections()
        known = ("format", "mesh", "world_size", "options", "collectives", "gates", "applied",
                 *(s.name for s in sections))  # fmt: skip
        _unknown(data, "plan", known)
        if "mesh" in data:
            dims = _get(data, "plan", "mesh", dict)
            _unknown(dims, "mesh", DIMS)
            for name in DIMS:
                value = _get(dims, "mesh", name, int, 1)
                if value < 1:
                    raise PlanError(f"plan field 'mesh.{name}' must be >= 1, not {value}")
            mesh = Mesh(**dims)
        else:
            world_size = _get(data, "plan", "world_size", int)
            if world_size < 1:
                raise PlanError(f"plan field 'world_size' must be >= 1, not {world_size}")
            mesh = Mesh(tp=world_size)
        if "world_size" in data and _get(data, "plan", "world_size", int) != mesh.world_size:
            raise PlanError(
                f"plan field 'world_size' is {data['world_size']}, but the mesh {mesh} has "
                f"{mesh.world_size}"
            )
        options = _get(data, "plan", "options", dict, {})
        _unknown(options, "options", OPTIONS)
        opts = {k: _get(options, "options", k, type(v), v) for k, v in OPTIONS.items()}
        for k, v in opts.items():
            if not isinstance(v, bool) and v < 0:
                raise PlanError(f"plan field 'options.{k}' must be >= 0, not {v}")
        gates = _gates(_get(data, "plan", "gates", dict, {}))
        read: dict[str, list[Any]] = {}
        for section in sections:
            name = section.name
            items = _get(data, "plan", name, list, _MISSING if section.required else [])
            read[name] = [section.entry.from_dict(item, f"{name}[{i}]")
                          for i, item in enumerate(items)]  # fmt: skip
            if section.check is not None:
                section.check(read[name], mesh)
        collectives = _get(data, "plan", "collectives", list, [])
        return cls(mesh, collectives=list(collectives), options=opts, gates=gates,
                   applied=list(_get(data, "plan", "applied", list, [])),
                   sections=read)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> ShardPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"the sharding plan is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ShardPlan:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise PlanError(f"cannot read the sharding plan {path}: {e.strerror or e}") from None
        return cls.from_json(text)

    # ----- printing -------------------------------------------------------------------------
    def table(self) -> Table:
        table = Table(title=f"sharding plan, mesh {self.mesh}", title_justify="left")
        for col in ("param", "style", "dim", "node", "why"):
            table.add_column(col, overflow="fold")
        for d in self.decisions:
            style = "green" if d.sharded else "dim"
            dim = "" if d.dim is None else str(d.dim)
            if d.parts and len(d.parts) > 1:
                dim += f" parts {d.parts}"
            table.add_row(d.param, Text(d.style, style=style), dim, d.node, d.reason)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table()
        for section in _sections():  # the decisions are the table; the others a line each
            for i, entry in enumerate(self.sections.get(section.name, [])):
                if hasattr(entry, "line"):
                    yield Text(entry.line(i))
        counts = self.collective_counts()
        if counts:
            yield Text("collectives per step: " + ", ".join(f"{v} {k}" for k, v in counts.items()))

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=160, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()
