"""fxpass's repair passes; importing this package registers them."""

from . import inplace_to_functional, repair_input_as_output, scalar_to_tensor  # noqa: F401
