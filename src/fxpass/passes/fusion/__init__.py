"""fxpass's fusion passes; importing this package registers them.

The norm patterns and the layout check the passes share are public here for passes in
other packages that fuse around the same norms (``distributed.fuse_allreduce_add_rmsnorm``).
"""

from . import fuse_add_rmsnorm, fuse_add_rmsnorm_quant, fuse_rmsnorm  # noqa: F401
from ._keep_layout import fake_result, keep_layout
from ._norm_patterns import ADD, add_ok, norm_ok, rms_norm, scalars

__all__ = ["ADD", "add_ok", "fake_result", "keep_layout", "norm_ok", "rms_norm", "scalars"]
