"""fxpass's fusion passes, one per module (``fxpass.passes`` imports them all).

The norm patterns and the layout check the passes share are public here for passes in
other packages that fuse around the same norms (``distributed.fuse_allreduce_add_rmsnorm``).
"""

from ._keep_layout import fake_result, keep_layout
from ._norm_patterns import ADD, add_ok, norm_ok, rms_norm, scalars

__all__ = ["ADD", "add_ok", "fake_result", "keep_layout", "norm_ok", "rms_norm", "scalars"]
