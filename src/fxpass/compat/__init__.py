"""Drop-in replacements for torch APIs, built on fxpass (see :mod:`fxpass.compat.fx`)."""
