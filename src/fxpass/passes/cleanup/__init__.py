"""fxpass's cleanup passes; importing this package registers them."""

from . import cse, dce, erase_copy, remove_detach, remove_noop  # noqa: F401
from . import remove_assert_ops  # noqa: F401
