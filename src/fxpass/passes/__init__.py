"""fxpass's pass library, one pass per file. Importing this package registers every pass."""

from . import (  # noqa: F401  (registration side effects)
    cleanup,
    default,
    functional,
    fusion,
    lower_fused_ops,
    partition,
    repair,
)
