"""fxpass's fusion passes; importing this package registers them."""

from . import fuse_add_rmsnorm, fuse_add_rmsnorm_quant, fuse_rmsnorm  # noqa: F401
