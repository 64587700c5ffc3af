"""The torch releases fxpass is tested with, checked first thing when fxpass is imported.

fxpass reaches into torch's internals (:mod:`fxpass.fxutil.fx_internals`, the export serializer, the
custom-op registry), which change between releases. The range below is the one tested: the
oldest end by the test suite (README, ``.ci/run``), the newest by ``.ci/torch-range``. It
matches ``pyproject.toml``'s ``torch`` requirement (``tests/test_setup.py`` holds them to
each other). This module imports nothing of fxpass, so the check runs before anything that
an older torch could break.
"""

from __future__ import annotations

import re
import warnings

__all__ = ["OLDEST", "NEWEST", "UntestedTorchWarning", "check_torch", "supported"]

#: The oldest and the newest torch minor release fxpass is tested with.
OLDEST = (2, 13)
NEWEST = (2, 14)


class UntestedTorchWarning(UserWarning):
    """fxpass runs on a torch newer than the newest release it was tested with."""


def supported() -> str:
    """``"2.13 to 2.14"``: the tested range, as the messages say it."""
    return f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch(version: str | None = None) -> None:
    """Refuse a torch older than :data:`OLDEST` (``ImportError``: fxpass uses what it lacks);
    warn once on one newer than :data:`NEWEST` (it may work: nothing known breaks it yet)."""
    if version is None:
        import torch

        version = torch.__version__
    minor = _minor(version)
    if minor is None:
        return
    pin = f"'torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}'"
    if minor < OLDEST:
        raise ImportError(
            f"fxpass supports torch {supported()} (tested); this is torch {version}: "
            f"pip install {pin}"
        )
    if minor > NEWEST:
        warnings.warn(
            f"fxpass is tested with torch {supported()}; torch {version} is untested (if "
            f"something breaks: pip install {pin})",
            UntestedTorchWarning,
            stacklevel=3,
        )
