"""What a pipeline run did: a tree of per-pass records that prints well and serializes.

Every run returns a :class:`Report` (``result.report``): the passes that ran, how long each
took (nested pipelines and fixpoints as subtrees), whether each changed the graph, how many
nodes it added or removed, the statistics it declared, the analyses it computed or was
served from the cache, and any suppressed check failures.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = ["PassRecord", "Report"]


@dataclass
class PassRecord:
    """One pass's part in a run. A nested pipeline's record has ``children``."""

    name: str
    spec: str = ""
    status: str = "ok"  # ok | failed | skipped | not-run
    modified: bool = False
    seconds: float = 0.0
    runs: int = 0
    nodes_before: int = 0
    nodes_after: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    children: list[PassRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    #: What the run suggests looking at: e.g. a rule that tried many nodes, matched few
    #: and came close somewhere (its near misses, and how to explain them). A hint is read
    #: with ``str()``: it may say less, or nothing, once later passes fused its sites.
    hints: list[Any] = field(default_factory=list)
    #: Analyses the pass asked for: name -> [computed, served from the cache]
    analyses: dict[str, list[int]] = field(default_factory=dict)

    def walk(self, depth: int = 0) -> Iterator[tuple[int, PassRecord]]:
        """This record and every record below it, with its depth."""
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "status": self.status,
            "modified": self.modified,
            "seconds": self.seconds,
            "runs": self.runs,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "stats": dict(self.stats),
            "notes": list(self.notes),
            "error": self.error,
            "hints": [str(h) for h in self.hints if str(h)],
            "analyses": {k: list(v) for k, v in self.analyses.items()},
            "children": [c.to_dict() for c in self.children],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassRecord:
        children = [cls.from_dict(c) for c in data.get("children", ())]
        fields = {k: v for k, v in data.items() if k != "children"}
        return cls(**fields, children=children)


@dataclass
class Report:
    """The record of one pipeline run. ``print(report)`` shows a table; ``to_json()`` for tools."""

    root: PassRecord
    suppressed: list[str] = field(default_factory=list)
    error: str | None = None
    #: where the run happened, set by the target: the pipeline's name, the hook, the graph
    #: (forward, backward, ...) and the compile range
    where: dict[str, str] = field(default_factory=dict)
    #: empty when the passes ran; else what gave the result without running them (an
    #: fxpass pipeline cache, Inductor's cache) — the records are those of the run that
    #: filled it
    cached: str = ""
    #: the passes before which the run took a whole-graph snapshot for its rollback (they
    #: may edit outside the editor; the others are undone from the editor's journal)
    snapshots: list[str] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return self.root.spec

    @property
    def seconds(self) -> float:
        return self.root.seconds

    @property
    def modified(self) -> bool:
        return self.root.modified

    @property
    def passes(self) -> list[PassRecord]:
        """Every record below the root, depth first."""
        return [rec for depth, rec in self.root.walk() if depth > 0]

    def find(self, name: str) -> PassRecord:
        """The first record of the pass called ``name``."""
        for rec in self.passes:
            if rec.name == name:
                return rec
        raise KeyError(f"no pass named {name!r} in this report; passes: {self.pass_names()}")

    def pass_names(self) -> list[str]:
        return [rec.name for rec in self.passes]

    def stats(self) -> dict[str, float]:
        """All statistics, keyed ``pass.statistic``, summed over repeated runs."""
        out: dict[str, float] = {}
        for rec in self.passes:
            for key, value in rec.stats.items():
                name = f"{rec.name}.{key}"
                out[name] = out.get(name, 0) + value
        return out

    def analysis_counts(self) -> dict[str, dict[str, list[int]]]:
        """Per pass (summed over repeated runs): analysis -> [computed, served from the
        cache]. Passes that asked for none are left out."""
        out: dict[str, dict[str, list[int]]] = {}
        for rec in self.passes:
            for name, (computed, cached) in rec.analyses.items():
                counts = out.setdefault(rec.name, {}).setdefault(name, [0, 0])
                counts[0] += computed
                counts[1] += cached
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "seconds": self.seconds,
            "modified": self.modified,
            "error": self.error,
            "suppressed": list(self.suppressed),
            "where": dict(self.where),
            "cached": self.cached,
            "root": self.root.to_dict(),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return cls(
            root=PassRecord.from_dict(data["root"]),
            suppressed=list(data.get("suppressed", ())),
            error=data.get("error"),
            where=dict(data.get("where", {})),
            cached=data.get("cached", ""),
        )

    def table(self) -> Table:
        total = self.root.seconds or 1e-12
        table = Table(expand=False)
        table.add_column("pass")
        table.add_column("changed", justify="center")
        table.add_column("ms", justify="right")
        table.add_column("%", justify="right")
        table.add_column("nodes", justify="right")
        table.add_column("statistics")
        for depth, rec in self.root.walk():
            if depth == 0:
                continue
            name = Text("  " * (depth - 1) + rec.name)
            if rec.runs > 1:
                name.append(f" x{rec.runs}", style="dim")
            if rec.status != "ok":
                name.append(f" [{rec.status}]", style="red" if rec.status == "failed" else "dim")
            delta = rec.nodes_after - rec.nodes_before
            table.add_row(
                name,
                Text("yes", style="green") if rec.modified else Text("-", style="dim"),
                f"{rec.seconds * 1e3:.2f}",
                f"{100 * rec.seconds / total:.1f}",
                f"{delta:+d}" if delta else "",
                ", ".join(f"{k}={_fmt(v)}" for k, v in _headline(rec.stats).items()),
            )
        table.caption = (
            f"{self.root.seconds * 1e3:.1f} ms, "
            f"{'changed' if self.modified else 'unchanged'}, "
            f"nodes {self.root.nodes_before} -> {self.root.nodes_after}"
        )
        table.caption_justify = "left"
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        head = Text(f"pipeline: {self.spec or self.root.name}", style="bold")
        if self.where:
            head.append("  " + " ".join(f"{k}={v}" for k, v in self.where.items()), style="dim")
        yield head
        if self.cached:
            yield Text(
                f"cached: the passes did not run; the result came from {self.cached} "
                "(the records below are from the run that filled it)",
                style="cyan",
            )
        yield self.table()
        for _, rec in self.root.walk():
            if rec.status == "skipped":
                for note in rec.notes:
                    yield Text(f"skipped: {rec.name}: {note}", style="dim")
        for line in self.suppressed:
            yield Text(f"suppressed: {line}", style="yellow")
        for _, rec in self.root.walk():
            for note in rec.notes:  # e.g. why a pass found nothing to change
                yield Text(f"note: {rec.name}: {note}", style="dim")
            for hint in filter(None, map(str, rec.hints)):  # a hint may be empty when read
                yield Text(f"hint: {rec.name}: {hint}", style="yellow")
        if self.error:
            yield Text(f"error: {self.error}", style="red")

    def __str__(self) -> str:
        buf = io.StringIO()
        Console(file=buf, width=120, color_system=None, force_terminal=False).print(self)
        return buf.getvalue().rstrip()


def _headline(stats: dict[str, float]) -> dict[str, float]:
    """The statistics a table shows: per-rule details (``rule.tried``...) only when a pass
    has nothing else to show; :meth:`Report.to_dict` and ``Statistics`` keep them all."""
    top = {k: v for k, v in stats.items() if "." not in k}
    return top or stats


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
