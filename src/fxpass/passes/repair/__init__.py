"""fxpass's repair passes, one per module (``fxpass.passes`` imports them all)."""
