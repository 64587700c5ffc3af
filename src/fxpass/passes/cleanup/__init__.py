"""fxpass's cleanup passes, one per module (``fxpass.passes`` imports them all)."""
