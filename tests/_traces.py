"""What fxpass writes to torch's structured log (``TORCH_TRACE``), captured in a test."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class Artifacts(logging.Handler):
    """Collects the ``fxpass_*`` artifacts logged while it is attached: ``(name, payload)``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.artifacts: list[tuple[str, str]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.artifacts]

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", {}).get("artifact")
        if meta is not None and meta["name"].startswith("fxpass_"):
            self.artifacts.append((meta["name"], record.payload))


@contextlib.contextmanager
def fxpass_artifacts() -> Iterator[Artifacts]:
    """Attaches an :class:`Artifacts` handler to torch's trace log for the block."""
    from torch._logging._internal import trace_log

    handler = Artifacts()
    trace_log.addHandler(handler)
    try:
        yield handler
    finally:
        trace_log.removeHandler(handler)
