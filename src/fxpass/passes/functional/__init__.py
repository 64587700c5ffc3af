"""fxpass's functional passes, one per module (``fxpass.passes`` imports them all)."""
