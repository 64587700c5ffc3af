"""A pytest plugin (``-p _without_extras``): the packages named in ``$FXPASS_TEST_WITHOUT``
(comma-separated, default ``executorch``) cannot be imported, as where they are not installed:
``import`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec`` finds nothing.
``tests/test_optional_extras.py`` runs test files under it to check that they skip."""

from __future__ import annotations

import os
import sys

WITHOUT = [n for n in os.environ.get("FXPASS_TEST_WITHOUT", "executorch").split(",") if n]

for _name in list(sys.modules):
    if _name.partition(".")[0] in WITHOUT:
        del sys.modules[_name]
for _name in WITHOUT:
    sys.modules[_name] = None  # type: ignore[assignment]  # how Python marks "not importable"
