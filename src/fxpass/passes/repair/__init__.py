"""fxpass's repair passes; importing this package registers them."""
