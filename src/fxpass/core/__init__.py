"""The core of fxpass: pass contract, pipeline, registry, spec, instrumentation, report.

The modules are layered: ``contract`` (what a pass is) < ``pipeline`` (running passes) <
``registry`` (names) < ``spec`` (text). A lower one calls a higher one only through the
hooks the higher one installs in :data:`fxpass.core.contract.hooks` when imported; importing
this package imports ``spec``, so they are always installed, and ``analyses``, so the
standard analyses are registered by name.
"""

from . import analyses as _analyses  # noqa: F401  (registers the standard analyses)
from . import spec as _spec  # noqa: F401  (installs the name, parse and run hooks)
