"""The switch for the improvements over Inductor's matching rules (off by default).

With it on, a pattern also matches where Inductor's rules refuse it but the rewrite is still
sound: through views, reshapes and no-op casts between its ops; where an intermediate has
users outside the match (it stays for them, or they read the replacement's value of it);
``auto_functionalized`` patterns on ``auto_functionalized_v2`` nodes; on graphs whose values
are meta tensors. Counts then exceed Inductor's; each pass's
``stats.extra`` (and ``extra_sites`` in an fxpass report) says by how many.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["improvements", "improvements_on", "set_improvements"]

_ON = [False]


def set_improvements(on: bool = True) -> None:
    """Turn the improvements on (or off) for every ``PatternMatcherPass`` made without
    ``improve=``."""
    if not isinstance(on, bool):
        raise TypeError(f"set_improvements(on): on must be True or False, got {on!r}")
    _ON[0] = on


def improvements_on() -> bool:
    """Whether the improvements are on for passes that do not say."""
    return _ON[0]


@contextlib.contextmanager
def improvements(on: bool = True) -> Iterator[None]:
    """``with improvements():`` — on inside the block, as they were after it."""
    before = _ON[0]
    set_improvements(on)
    try:
        yield
    finally:
        _ON[0] = before
