"""fxpass's version (``fxpass.__version__``), where every layer can read it."""

__version__ = "0.1.0"
