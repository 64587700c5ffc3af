"""fxpass's fusion passes; importing this package registers them."""
