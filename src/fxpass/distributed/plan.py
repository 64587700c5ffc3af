"""The sharding plan: data a user can print, edit and pass back.

One :class:`Decision` per weight the analysis looked at: how it is cut (``column``: its
rows, the output features, dim 0; ``row``: its columns, the input features, dim 1;
``vocab``: an embedding's rows, dim 0; ``replicate``: whole on every rank), which graph
node reads it, the parts a fused projection is cut in, and why. A plan round-trips
through JSON (``plan.save(path)`` / ``ShardPlan.load(path)``) and prints as a table.
The ``collectives`` it lists are what the plan implies (derived again when the plan is
used, so editing them does nothing).

.. code-block:: json

    {"format": "fxpass.shard_plan/1", "world_size": 2,
     "decisions": [{"param": "model.layers.0.self_attn.q_proj.weight", "style": "column",
                    "dim": 0, "node": "linear", "parts": [64], "bias": null,
                    "reason": "column-parallel: reads replicated 'mul_4'; ..."}, ...]}
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

__all__ = ["FORMAT", "STYLES", "Decision", "PlanError", "ShardError", "ShardPlan"]

FORMAT = "fxpass.shard_plan/1"
#: Each style and the weight dim it cuts.
STYLES: dict[str, int | None] = {"column": 0, "row": 1, "vocab": 0, "replicate": None}


class ShardError(FxpassError):
    """A program cannot be sharded as asked (a one-line message says why and what to do)."""


class PlanError(ShardError):
    """A plan is malformed or does not fit the program it is applied to."""


@dataclass
class Decision:
    """How one weight is laid out across ranks, and why."""

    param: str
    style: str
    node: str
    dim: int | None = None
    parts: list[int] = field(default_factory=list)
    bias: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise PlanError(
                f"decision for '{self.param}': style must be one of {sorted(STYLES)}, "
                f"not {self.style!r}"
            )
        if self.dim is None:
            self.dim = STYLES[self.style]
        if self.dim != STYLES[self.style]:
            raise PlanError(
                f"decision for '{self.param}': a {self.style} weight is cut along dim "
                f"{STYLES[self.style]}, not {self.dim}"
            )
        self.parts = [int(p) for p in self.parts or ()]

    @property
    def sharded(self) -> bool:
        return self.style != "replicate"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ShardPlan:
    """Every decision for one program and world size (see the module docstring)."""

    world_size: int
    decisions: list[Decision]
    collectives: list[dict[str, Any]] = field(default_factory=list)

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
    def sharded(self) -> list[Decision]:
        return [d for d in self.decisions if d.sharded]

    # ----- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "world_size": self.world_size,
            "decisions": [d.to_dict() for d in self.decisions],
            "collectives": list(self.collectives),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    @classmethod
    def from_dict(cls, data: Any) -> ShardPlan:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanError(f"not a sharding plan: expected a JSON object with format {FORMAT!r}")
        try:
            decisions = [Decision(**d) for d in data["decisions"]]
            world_size = int(data["world_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"malformed sharding plan: {type(e).__name__}: {e}") from None
        return cls(world_size, decisions, list(data.get("collectives", ())))

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
        table = Table(title=f"sharding plan, world size {self.world_size}", title_justify="left")
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
        counts: dict[str, int] = {}
        for c in self.collectives:
            counts[c["op"]] = counts.get(c["op"], 0) + 1
        if counts:
            yield Text("collectives per step: " + ", ".join(f"{v} {k}" for k, v in counts.items()))

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=160, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()
