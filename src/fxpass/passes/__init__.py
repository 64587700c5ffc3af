"""fxpass's pass library, one pass per file. Importing this package registers every pass.

It imports every public module under it (``passes/<group>/<name>.py``, ``passes/<name>.py``),
in name order: a new pass file is found here, with no import line to add anywhere.
"""

import importlib
import pkgutil


def _import_all(path: list[str], prefix: str) -> None:
    for info in pkgutil.iter_modules(path, prefix):
        if info.name.rpartition(".")[2].startswith("_"):  # a private helper: its passes import it
            continue
        module = importlib.import_module(info.name)
        if info.ispkg:
            _import_all(module.__path__, f"{module.__name__}.")


_import_all(__path__, f"{__name__}.")
