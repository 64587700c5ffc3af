"""The errors fxpass raises. Each says what was wrong and what to do about it."""

from __future__ import annotations

from collections.abc import Sequence

from ..fxutil.messages import clip, excerpt

__all__ = [
    "CheckFailedError",
    "ConstraintCycleError",
    "FxpassError",
    "NestingError",
    "NonConvergenceError",
    "OptionError",
    "PassFailedError",
    "SpecError",
    "UnknownPassError",
]


class FxpassError(Exception):
    """Base class of every error fxpass raises on purpose."""


class PassFailedError(FxpassError):
    """A pass raised. The graph module the pipeline was given has been put back as it was.

    ``pass_name`` is the failing pass, ``ran_before`` the passes that ran before it in this
    run (in order), and ``__cause__`` the original exception.
    """

    def __init__(
        self,
        pass_name: str,
        ran_before: Sequence[str],
        cause: BaseException,
        *,
        restored: bool = True,
        reproducer: str | None = None,
    ) -> None:
        self.pass_name = pass_name
        self.ran_before = list(ran_before)
        self.cause = cause
        self.restored = restored
        self.reproducer = reproducer
        super().__init__(self._message())

    def _message(self) -> str:
        before = ", ".join(self.ran_before) if self.ran_before else "none"
        lines = [
            f"pass '{self.pass_name}' failed: {type(self.cause).__name__}: {self.cause}",
            f"  passes that ran before it: {before}",
        ]
        if self.restored:
            lines.append("  the graph module was restored to its state before the pipeline ran")
        if self.reproducer:
            lines.append(f"  reproduce with: {self.reproducer}")
        return "\n".join(lines)

    def with_reproducer(self, command: str) -> PassFailedError:
        self.reproducer = command
        self.args = (self._message(),)
        return self


class CheckFailedError(PassFailedError):
    """A check (graph lint or a user check) failed after a pass changed the graph."""

    def __init__(
        self,
        pass_name: str,
        check_name: str,
        ran_before: Sequence[str],
        cause: BaseException,
        **kwargs,
    ) -> None:
        self.check_name = check_name
        super().__init__(pass_name, ran_before, cause, **kwargs)

    def _message(self) -> str:
        where = (
            "on the input graph, before any pass ran"
            if self.pass_name == "(input)"
            else f"after pass '{self.pass_name}'"
        )
        first = (
            f"check '{self.check_name}' failed {where}: {type(self.cause).__name__}: {self.cause}"
        )
        rest = super()._message().split("\n", 1)[1]
        return f"{first}\n{rest}"


class ConstraintCycleError(FxpassError, ValueError):
    """Ordering constraints between passes contradict each other."""

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        path = " -> ".join([*self.cycle, self.cycle[0]])
        super().__init__(
            f"pass ordering constraints form a cycle: {path}; "
            "remove one of these constraints or one of the passes"
        )


class NestingError(FxpassError, ValueError):
    """Groups of passes nest deeper than fxpass runs them (see
    :data:`fxpass.core.run.MAX_NESTING`)."""


class NonConvergenceError(FxpassError):
    """A fixpoint did not stop changing the graph within its iteration limit."""


class SpecError(FxpassError, ValueError):
    """A textual pipeline spec is malformed. ``column`` is 1-based. The message shows the
    spec under it (a long one: the part around the column) with a ``^`` at the column."""

    def __init__(self, message: str, spec: str, column: int) -> None:
        self.message = message
        self.spec = spec
        self.column = column
        shown, at = excerpt(spec, column)
        pointer = " " * (at - 1) + "^"
        super().__init__(f"{message} (column {column})\n  {shown}\n  {pointer}")


class UnknownPassError(SpecError, KeyError):
    """No pass is registered under a name; the message suggests the closest names."""

    def __init__(self, name: str, suggestions: Sequence[str], spec: str = "", column: int = 1):
        self.name = name
        self.suggestions = list(suggestions)
        hint = (
            f"; did you mean {', '.join(repr(s) for s in self.suggestions)}?"
            if self.suggestions
            else "; `fxpass list` shows the registered passes"
        )
        SpecError.__init__(self, f"unknown pass '{clip(name)}'{hint}", spec or name, column)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class OptionError(SpecError, TypeError):
    """A pass option is unknown or its value has the wrong type."""
