"""Writing a file atomically: readers see the old file or the new one, never half of one.

>>> write_atomic("report.html", "<html>...</html>")              # doctest: +SKIP
>>> write_atomic("model.pt2", lambda tmp: torch.export.save(ep, tmp))   # doctest: +SKIP

The content goes to a temporary file beside ``path`` (same folder, so the rename stays on
one file system), which is renamed over ``path`` once it is complete. If writing fails —
an exception, a full disk, Ctrl-C — the temporary file is removed and ``path`` is left as
it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike, content: str | bytes | Callable[[str], Any]) -> Path:
    """Write ``content`` to ``path`` atomically; returns ``path`` as a :class:`~pathlib.Path`.

    ``content`` is the text (UTF-8) or bytes to write, or a function ``write(tmp)`` that
    writes the file named ``tmp`` itself (``torch.save``, ``torch.export.save``: the
    temporary name ends with ``path``'s suffix). The file gets the permissions a new file
    gets (``0o666`` less the umask), not the ``0o600`` of a temporary file. The folder must
    exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    try:
        if callable(content):
            os.close(fd)
            content(tmp)
        else:
            data = content.encode() if isinstance(content, str) else content
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask
