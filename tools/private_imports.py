"""An import-linter contract: no private name crosses a package boundary.

A name with a leading underscore — a private module (``fxpass.passes.fusion._keep_layout``)
or a private name imported from a module (``from ..verify.streams import _Memory``) — is
private to the package that holds it. The contract walks every import between two packages
of the container (its top-level subpackages; a module directly in the container, and the
container's own private modules, are the container's) and fails on each one that takes a
private module or a private name. Within one package anything goes.

Registered in ``pyproject.toml``::

    [tool.importlinter]
    contract_types = ["private_imports: tools.private_imports.PrivateImportsContract"]

    [[tool.importlinter.contracts]]
    type = "private_imports"
    containers = ["fxpass"]

grimp says which module imports which, at which lines; the names a ``from ... import``
takes are read from the importing module's source at those lines (an import written over
several lines is one statement there).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["PrivateImportsContract", "is_private", "owner", "private_imports"]


def is_private(name: str) -> bool:
    """``_x`` is private; ``__x__`` (``__version__``, ``__init__``) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def owner(module: str, container: str) -> str:
    """The package of ``container`` that ``module`` belongs to: its top-level subpackage or
    module, or the container itself for the container and its private modules."""
    parts = module.split(".")
    if len(parts) == 1 or is_private(parts[1]):
        return container
    return f"{container}.{parts[1]}"


@cache
def _statements(path: Path) -> list[ast.stmt]:
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _source(module: str, root: Path, is_package: bool) -> Path:
    rel = Path(*module.split(".")[1:])
    return root / rel / "__init__.py" if is_package else (root / rel).with_suffix(".py")


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def private_imports(graph: ImportGraph, container: str, root: Path) -> list[dict]:
    """Every import in ``graph`` from one package of ``container`` that takes a private
    module or name of another: ``importer``, ``imported`` (``module:name`` for a name),
    ``line_number``, ``line_contents``. ``root`` is the container's folder."""
    found = []
    for importer in sorted(graph.find_descendants(container) | {container}):
        mine = owner(importer, container)
        is_package = bool(graph.find_children(importer)) or importer == container
        path = _source(importer, root, is_package)
        if not path.is_file():  # a namespace package
            path, is_package = _source(importer, root, True), True
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if owner(imported, container) == mine or not imported.startswith(container + "."):
                continue
            lines = {
                d["line_number"]: d["line_contents"]
                for d in graph.get_import_details(importer=importer, imported=imported)
            }
            for line, contents in sorted(lines.items()):
                for what in _taken(path, line, importer, imported, is_package):
                    found.append({"importer": importer, "imported": what,
                                  "line_number": line, "line_contents": contents})  # fmt: skip
    return found


def _taken(path: Path, line: int, importer: str, imported: str, is_package: bool) -> list[str]:
    """What the import at ``line`` of ``importer`` takes from ``imported`` that is private."""
    inner = imported.split(".")[1:]
    out = [imported] if any(is_private(p) for p in inner) else []
    for node in _statements(path):
        if not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, importer, is_package)
            for alias in node.names:
                if source == imported and is_private(alias.name):
                    out.append(f"{imported}:{alias.name}")
    return list(dict.fromkeys(out))


class PrivateImportsContract(Contract):
    """No module of one package of each container imports a private module or name of
    another package of it (see :mod:`tools.private_imports`)."""

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        found = []
        for container in self.containers:
            spec = importlib.util.find_spec(container)
            if spec is None or spec.origin is None:
                raise ValueError(f"private_imports: cannot find the package '{container}'")
            found += private_imports(graph, container, Path(spec.origin).parent)
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for f in check.metadata["found"]:
            output.print_error(
                f"{f['importer']}:{f['line_number']} takes the private {f['imported']} "
                f"of another package: {f['line_contents'].strip()}",
                bold=False,
            )
        output.new_line()
        output.print(
            "Make the name public in its package (no underscore) when it is shared for a "
            "reason, or move the concept to the package that uses it."
        )
