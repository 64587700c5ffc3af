"""fxpass's functional passes; importing this package registers them."""

from . import fix_functionalization  # noqa: F401
