"""fxpass's cleanup passes; importing this package registers them."""

from . import (  # noqa: F401
    cse,
    dce,
    erase_copy,
    remove_assert_ops,
    remove_detach,
    remove_noop,
)
