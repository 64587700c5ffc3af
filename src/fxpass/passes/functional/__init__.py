"""fxpass's functional passes; importing this package registers them."""
