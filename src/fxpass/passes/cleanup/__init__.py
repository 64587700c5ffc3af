"""fxpass's cleanup passes; importing this package registers them."""
